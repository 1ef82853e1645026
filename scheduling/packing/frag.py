"""GPU fragmentation of a node against a target workload (FGD, ATC'23; the reference's
`NodeGpuShareFragAmount` / `FragAmountSumExceptQ3`).

For a node with free CPU ``c``, free milli-GPU per device ``L[g]`` (``L_tot = sum L``) and GPU model ``T``, and
each typical pod m (CPU ``cpu_m``, per-GPU ``g_m``, count ``k_m``, weight ``p_m``):

* CPU-only task (``g_m == 0``): all free GPU is a fragment (class XL if ``c >= cpu_m``, else XR);
* model constraint not met: all free GPU is a fragment (NA);
* at least ``k_m`` devices with ``L[g] >= g_m`` and ``c >= cpu_m`` (Q3): only the devices too small for m are
  fragments, ``sum_{L[g] < g_m} L[g]`` (booked in the Q2 bucket);
* otherwise (Q4: lacks CPU; Q2: lacks GPU; Q1: lacks both): all free GPU is a fragment.

``F_n = sum_m p_m * frag_m``; memory plays no part. For bit-exact FGD scores the sum is accumulated like the
reference: ``p_m * frag_m`` into per-class buckets in typical-pod order, then the buckets summed in the order
Q1, Q2, Q4, XL, XR, NA (starting from 0.0). All functions here are vectorized over a batch of node states.
"""

from __future__ import annotations

import weakref

import numpy as np

from scheduling.packing.workload import TargetWorkload

Q1, Q2, Q3, Q4, XL, XR, NA = range(7)
CLASS_NAMES = ("q1_lack_both", "q2_lack_gpu", "q3_satisfied", "q4_lack_cpu", "xl_satisfied", "xr_lack_cpu", "no_access")


class FragTables:
    """A workload prepared for one cluster's GPU-model list (the arrays the batch kernel needs). GPU typical
    pods only ever book into Q1/Q2/Q4/NA and CPU-only ones into XL/XR, so the two groups are summed apart,
    each in typical-pod order."""

    __slots__ = (
        "access",
        "typed",
        "g_values",
        "g_index",
        "cpu_g",
        "k_g",
        "p_g",
        "access_g",
        "cpu_c",
        "p_c",
        "memo",
        "memo_limit",
    )

    def __init__(self, workload: TargetWorkload, model_names: tuple[str, ...]):
        # no reference back to the workload: frag_tables() caches these in a WeakKeyDictionary keyed on it
        g = workload.gpu_milli.astype(np.int64)
        gpu_rows = np.flatnonzero(g > 0)
        cpu_rows = np.flatnonzero(g == 0)
        self.access = workload.access_matrix(model_names)  # (M, n_models)
        self.access_g = np.ascontiguousarray(self.access[gpu_rows])
        self.typed = bool((~self.access_g).any())
        self.g_values, self.g_index = np.unique(g[gpu_rows], return_inverse=True)
        self.cpu_g = workload.cpu[gpu_rows].astype(np.int64)[:, None]
        self.k_g = workload.num_gpu[gpu_rows].astype(np.int64)[:, None]
        self.p_g = workload.weight[gpu_rows].astype(np.float64)[:, None]
        self.cpu_c = workload.cpu[cpu_rows].astype(np.int64)[:, None]
        self.p_c = workload.weight[cpu_rows].astype(np.float64)[:, None]
        self.memo: dict[bytes, float] = {}  # state key -> F (see state_keys)
        self.memo_limit = 1 << 18  # entries (~35 MB); cleared when full


_TABLES: weakref.WeakKeyDictionary[TargetWorkload, dict] = weakref.WeakKeyDictionary()


def frag_tables(workload: TargetWorkload, model_names: tuple[str, ...]) -> FragTables:
    """The shared FragTables (and memo) of a workload for a GPU-model list."""
    per = _TABLES.get(workload)
    if per is None:
        per = _TABLES[workload] = {}
    tables = per.get(model_names)
    if tables is None:
        tables = per[model_names] = FragTables(workload, model_names)
    return tables


_B_Q1, _B_Q2, _B_Q4, _B_NA = 0, 1, 2, 3  # GPU-group bucket columns
_GPU_BUCKETS = np.arange(4)[None, None, :]
_CPU_BUCKETS = np.arange(2)[None, None, :]


def _bucket_sums(v: np.ndarray, bucket: np.ndarray, buckets: np.ndarray) -> np.ndarray:
    """(rows=typical pods, B) values and bucket ids -> (B, n_buckets) sums, each accumulated in typical-pod
    order like the reference's loop (cumsum, not numpy's pairwise summation)."""
    spread = v[:, :, None] * (bucket[:, :, None] == buckets)
    return np.cumsum(spread, axis=0)[-1]


def node_frag_batch(cpu_left: np.ndarray, gpu_free: np.ndarray, model_id: np.ndarray, tables: FragTables) -> np.ndarray:
    """F_n(M) for a batch of node states: ``cpu_left`` (B,), ``gpu_free`` (B, G) milli-GPU per device (absent
    devices as 0), ``model_id`` (B,) index into the model list ``tables`` was built for. Returns float64 (B,)."""
    cpu_left = np.asarray(cpu_left, dtype=np.int64)
    LT = np.asarray(gpu_free, dtype=np.int64).T  # (G, B)
    B = LT.shape[1]
    t = tables
    l_tot = LT.sum(axis=0)  # (B,)
    q1 = q2 = q4 = na = xl = xr = 0.0
    if len(t.g_index):
        ge = LT[:, None, :] >= t.g_values[None, :, None]  # (G, J, B): device fits typical size j
        cnt = ge.sum(axis=0)[t.g_index]  # (Mg, B) devices that fit
        small = l_tot - (ge * LT[:, None, :]).sum(axis=0)[t.g_index]  # free milli on devices that do not
        cpu_ok = cpu_left >= t.cpu_g  # (Mg, B)
        host = cnt >= t.k_g
        if t.typed:
            acc = t.access_g[:, model_id]
            amount = np.where(host & cpu_ok & acc, small, l_tot)
            bucket = np.where(acc, np.where(cpu_ok, _B_Q2, np.where(host, _B_Q4, _B_Q1)), _B_NA)
        else:
            amount = np.where(host & cpu_ok, small, l_tot)
            bucket = np.where(cpu_ok, _B_Q2, np.where(host, _B_Q4, _B_Q1))
        sums = _bucket_sums(t.p_g * amount, bucket, _GPU_BUCKETS)
        q1, q2, q4, na = sums[:, 0], sums[:, 1], sums[:, 2], sums[:, 3]
    if len(t.p_c):
        v = t.p_c * l_tot.astype(np.float64)  # (Mc, B)
        sums = _bucket_sums(v, (cpu_left < t.cpu_c).astype(np.int64), _CPU_BUCKETS)
        xl, xr = sums[:, 0], sums[:, 1]
    total = 0.0 + q1
    total = total + q2
    total = total + q4
    total = total + xl
    total = total + xr
    total = total + na
    return np.broadcast_to(np.asarray(total, dtype=np.float64), (B,)).copy()


def state_keys(cpu_left: np.ndarray, gpu_free: np.ndarray, model_id: np.ndarray) -> list[bytes]:
    """Memo keys of node states: (free CPU, GPU model, free milli per device sorted) as bytes. F depends on the
    devices' free shares only as a multiset, so the sorted row is an exact key (the reference memoizes on the
    same)."""
    B = len(cpu_left)
    rows = np.empty((B, gpu_free.shape[1] + 2), dtype=np.int32)
    rows[:, 0] = cpu_left
    rows[:, 1] = model_id
    rows[:, 2:] = np.sort(gpu_free, axis=1)
    return rows.view(f"S{rows.shape[1] * 4}").ravel().tolist()


def node_frag_memo(cpu_left: np.ndarray, gpu_free: np.ndarray, model_id: np.ndarray, tables: FragTables) -> np.ndarray:
    """:func:`node_frag_batch` through the tables' memo: states seen before are looked up, the others (each
    distinct one once) computed and remembered."""
    cpu_left = np.asarray(cpu_left)
    gpu_free = np.asarray(gpu_free)
    model_id = np.asarray(model_id)
    keys = state_keys(cpu_left, gpu_free, model_id)
    memo = tables.memo
    get = memo.get
    vals = [get(k) for k in keys]
    if None in vals:
        first: dict[bytes, int] = {}
        for i, v in enumerate(vals):
            if v is None and keys[i] not in first:
                first[keys[i]] = i
        idx = np.fromiter(first.values(), dtype=np.int64, count=len(first))
        fresh = dict(zip(first, node_frag_batch(cpu_left[idx], gpu_free[idx], model_id[idx], tables).tolist()))
        vals = [fresh[k] if v is None else v for k, v in zip(keys, vals)]
        if len(memo) + len(fresh) > tables.memo_limit:
            memo.clear()
        memo.update(fresh)
    return np.array(vals, dtype=np.float64)


def node_frag_scalar(cpu_left: int, gpu_free, gpu_model: str, workload: TargetWorkload) -> float:
    """The same measure for one node, written plainly (the reference's loop); used to check the batch kernel."""
    buckets = [0.0] * 7
    free = [int(x) for x in gpu_free]
    l_tot = sum(free)
    for m in range(len(workload)):
        p = float(workload.weight[m])
        cpu_m, g_m, k_m = int(workload.cpu[m]), int(workload.gpu_milli[m]), int(workload.num_gpu[m])
        spec = workload.gpu_spec[m]
        if g_m == 0:
            buckets[XL if cpu_left >= cpu_m else XR] += p * float(l_tot)
            continue
        if spec and (not gpu_model or gpu_model not in spec.split("|")):
            buckets[NA] += p * float(l_tot)
            continue
        can_host = sum(1 for x in free if x >= g_m) >= k_m
        if can_host and cpu_left >= cpu_m:
            frag = sum(x for x in free if x < g_m)
            buckets[Q2] += p * float(frag)
            buckets[Q3] += p * float(l_tot - frag)
        elif can_host:
            buckets[Q4] += p * float(l_tot)
        else:
            buckets[Q2 if cpu_left >= cpu_m else Q1] += p * float(l_tot)
    out = 0.0
    for b in (Q1, Q2, Q4, XL, XR, NA):
        out += buckets[b]
    return out
