"""Packer unit tests on small hand-made clusters: pods, typical pods, fragmentation, feasibility, scores,
tie-breaking, allocation/release; and a cross-check of the vectorized policies against plain per-node code."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from scheduling.packing import (
    DISPLAY_NAMES,
    FGD,
    POLICIES,
    POLICY_NAMES,
    BestFit,
    Cluster,
    DotProd,
    FragTables,
    GpuClustering,
    GpuPacking,
    Placement,
    Pod,
    RandomFit,
    TargetWorkload,
    UnknownNameError,
    make_policy,
    node_frag_batch,
    node_frag_scalar,
)
from scheduling.packing.frag import frag_tables, node_frag_memo


def make_cluster(specs, ranks=None) -> Cluster:
    """specs: (name, cpu_milli, memory_mib, gpus, model)."""
    frame = pd.DataFrame(specs, columns=["sn", "cpu_milli", "memory_mib", "gpu", "model"])
    return Cluster.from_nodes(frame, tiebreak_rank=ranks)


def set_free(cluster: Cluster, node: int, gpu_free: list[int], cpu_free: int | None = None) -> None:
    """Occupy resources with filler pods so the node has the given free shares (keeps the API honest)."""
    for g, free in enumerate(gpu_free):
        used = 1000 - free
        if used:
            cluster.allocate(Pod(f"fill-{node}-{g}", 0, 0, 1, used), node, (g,))
    if cpu_free is not None:
        cluster.allocate(Pod(f"fill-{node}-cpu", int(cluster.cpu_free[node] - cpu_free)), node)


# ------------------------------------------------------------------------------------------------ pods
def test_pod_normalization():
    assert Pod("a", 1000, 10, 1, 1500).gpu_milli == 1000  # clipped to one device
    cpu_only = Pod("b", 1000, 10, 0, 500, "V100M16")
    assert (cpu_only.num_gpu, cpu_only.gpu_milli, cpu_only.gpu_spec) == (0, 0, "")
    assert Pod("c", 1000, 10, 2, 0).num_gpu == 0  # no share asked: not a GPU pod
    typed = Pod("d", 1000, 10, 1, 500, "V100M16||V100M32|")
    assert typed.gpu_spec == "V100M16|V100M32" and typed.allows_model("V100M32") and not typed.allows_model("T4")
    assert typed.is_shared and typed.affinity_tag == "share-gpu"
    assert Pod("e", 1, 1, 4, 1000).affinity_tag == "4-gpu" and Pod("f", 1, 1).affinity_tag is None
    with pytest.raises(ValueError):
        Pod("g", -1)


# ------------------------------------------------------------------------------------------------ typical pods
def test_typical_pods_counting_ties_and_cut():
    pods = (
        [Pod(f"a{i}", 4000, 0, 1, 500) for i in range(5)]
        + [Pod(f"b{i}", 2000, 0, 1, 1000) for i in range(3)]
        + [Pod(f"c{i}", 3000, 0, 0, 0) for i in range(3)]  # ties with b: larger key (cpu 3000) first
        + [Pod("d", 1000, 0, 1, 200)]
    )
    wl = TargetWorkload.from_pods(pods, popularity_threshold=90)
    # 12 pods, 90 % -> 10.8: keys a (5), c (3, larger cpu than b), b (3) -> 11 >= 10.8, d dropped
    assert list(wl.cpu) == [4000, 3000, 2000]
    assert list(wl.gpu_milli) == [500, 0, 1000] and list(wl.num_gpu) == [1, 0, 1]
    assert wl.weight[0] == (5 / 12) / (11 / 12)  # exactly the reference's float expression
    assert abs(wl.weight.sum() - 1) < 1e-12 and wl.coverage == 11 / 12 and wl.n_keys_total == 4


def test_typical_pods_default_trace(data_dir):
    """The default trace's typical pods against a count of its CSV rows with pandas (the reference's keys: CPU,
    per-GPU milli, GPU count, model list; CPU-only rows ask for no GPU): the most common keys, the larger key first
    among equal counts, up to 95 % of the pods."""
    from scheduling.evaluation.fgd_replay import load_pods

    wl = TargetWorkload.from_pods(load_pods("default", data_dir))
    rows = pd.read_csv(
        data_dir / "openb" / "openb_pod_list_default.csv", keep_default_na=False, dtype={"gpu_spec": str}
    )
    gpu = (rows["num_gpu"] > 0) & (rows["gpu_milli"] > 0)
    keys = pd.DataFrame(
        {
            "cpu": rows["cpu_milli"],
            "milli": rows["gpu_milli"].clip(upper=1000).where(gpu, 0),
            "n": rows["num_gpu"].where(gpu, 0),
            "spec": rows["gpu_spec"].str.replace(r"\|+", "|", regex=True).str.strip("|").where(gpu, ""),
        }
    )
    counts = keys.value_counts().reset_index().sort_values(["count", "cpu", "milli", "n", "spec"], ascending=False)
    kept = int((counts["count"].cumsum().shift(fill_value=0) < 0.95 * len(rows)).sum())
    top = counts.iloc[:kept]
    assert (len(wl), wl.n_keys_total) == (kept, len(counts))
    assert wl.coverage == pytest.approx(top["count"].sum() / len(rows), abs=1e-12)
    assert list(zip(wl.cpu, wl.gpu_milli, wl.num_gpu, wl.gpu_spec)) == list(
        top[["cpu", "milli", "n", "spec"]].itertuples(index=False, name=None)
    )
    np.testing.assert_allclose(wl.weight, top["count"] / top["count"].sum(), rtol=1e-12)
    assert len(rows) == 8152  # the trace's README: "8152 tasks"


# ------------------------------------------------------------------------------------------------ fragmentation
def test_node_fragmentation_by_hand():
    wl = TargetWorkload.from_specs([(4000, 500, 1), (2000, 0, 0)], [0.5, 0.5])
    c = make_cluster([("n0", 10000, 1000, 2, "V100")])
    set_free(c, 0, [1000, 300])
    # typical 1: device 0 fits, CPU fits -> only device 1 (300 < 500) is a fragment: 0.5 * 300
    # typical 2: CPU-only -> all free GPU (1300) is a fragment: 0.5 * 1300
    assert c.fragmentation(wl) == 150.0 + 650.0
    set_free(c, 0, [1000, 1000], cpu_free=3000)  # CPU now lacks for typical 1 (Q4): all 1300
    assert c.fragmentation(wl) == 650.0 + 650.0


@pytest.mark.parametrize(
    "gpu_free,cpu_free,spec,expected",
    [
        ([1000, 1000], 8000, "", 0.0),  # Q3, nothing too small
        ([400, 300], 8000, "", 700.0),  # Q2: no device fits 500 -> all free
        ([400, 300], 1000, "", 700.0),  # Q1: lacks both
        ([600, 300], 1000, "", 900.0),  # Q4: lacks CPU
        ([600, 300], 8000, "", 300.0),  # Q3: the 300 device is a fragment
        ([600, 300], 8000, "A100", 900.0),  # NA: model not allowed
        ([600, 300], 8000, "V100|A100", 300.0),
        ([0, 0], 8000, "", 0.0),  # nothing free, nothing fragmented
    ],
)
def test_fragmentation_classes(gpu_free, cpu_free, spec, expected):
    wl = TargetWorkload.from_specs([(2000, 500, 1, spec)], [1.0])
    c = make_cluster([("n0", 16000, 1000, 2, "V100")])
    set_free(c, 0, gpu_free, cpu_free)
    assert c.fragmentation(wl) == expected
    assert node_frag_scalar(cpu_free, gpu_free, "V100", wl) == expected


def test_multi_gpu_typical_pod_needs_k_devices():
    wl = TargetWorkload.from_specs([(1000, 1000, 2)], [1.0])
    c = make_cluster([("n0", 16000, 1000, 4, "T4")])
    set_free(c, 0, [1000, 500, 1000, 0])
    assert c.fragmentation(wl) == 500.0  # two whole devices fit; the half-used one is a fragment
    c.allocate(Pod("x", 0, 0, 1, 1000), 0, (0,))
    assert c.fragmentation(wl) == 1500.0  # one whole device left: cannot host -> all free


def test_batch_kernel_matches_plain_loop_bit_for_bit():
    rng = np.random.default_rng(7)
    models = ("", "A10", "T4", "V100M16")
    specs = [
        (int(rng.choice([0, 2000, 4000, 8000, 16000])), int(g), int(k), s)
        for g, k, s in [
            (0, 0, ""),
            (500, 1, ""),
            (230, 1, "T4"),
            (1000, 1, ""),
            (1000, 2, ""),
            (810, 1, "V100M16|A10"),
            (1000, 8, ""),
            (0, 0, ""),
            (470, 1, ""),
        ]
    ]
    wl = TargetWorkload.from_specs(specs, rng.dirichlet(np.ones(len(specs))))
    tables = FragTables(wl, models)
    B = 400
    gpu_free = rng.choice([0, 50, 190, 230, 300, 470, 500, 810, 1000], size=(B, 8))
    cpu = rng.integers(0, 20000, size=B)
    model = rng.integers(1, len(models), size=B)
    got = node_frag_batch(cpu, gpu_free, model, tables)
    want = [node_frag_scalar(int(cpu[i]), gpu_free[i], models[model[i]], wl) for i in range(B)]
    assert got.tolist() == want
    memo_tables = frag_tables(wl, models)
    assert node_frag_memo(cpu, gpu_free, model, memo_tables).tolist() == want
    assert node_frag_memo(cpu[::-1], gpu_free[::-1], model[::-1], memo_tables).tolist() == want[::-1]


def test_fragmentation_cache_follows_changes():
    wl = TargetWorkload.from_specs([(1000, 600, 1)], [1.0])
    c = make_cluster([("a", 8000, 100, 1, "T4"), ("b", 8000, 100, 1, "T4")])
    assert c.fragmentation(wl) == 0.0
    c.allocate(Pod("p", 1000, 0, 1, 500), 0, (0,))
    assert c.node_fragmentation(wl).tolist() == [500.0, 0.0]
    c.release("p")
    assert c.fragmentation(wl) == 0.0


# ------------------------------------------------------------------------------------------------ feasibility
def test_feasibility_rules():
    c = make_cluster(
        [
            ("cpu-node", 64000, 1000, 0, ""),
            ("t4", 16000, 1000, 2, "T4"),
            ("v100", 16000, 100, 2, "V100M16"),
            ("a10", 2000, 1000, 1, "A10"),
        ]
    )
    feas = lambda **kw: c.feasible(Pod("p", **kw)).tolist()  # noqa: E731
    assert feas(cpu_milli=4000, memory_mib=500) == [True, True, False, False]  # memory, CPU
    assert feas(cpu_milli=1000, memory_mib=50, num_gpu=1, gpu_milli=500) == [False, True, True, True]
    assert feas(cpu_milli=1000, num_gpu=1, gpu_milli=500, gpu_spec="V100M16|V100M32") == [False, False, True, False]
    assert feas(cpu_milli=1000, num_gpu=2, gpu_milli=1000) == [False, True, True, False]
    c.allocate(Pod("s", 0, 0, 1, 100), 1, (0,))
    assert feas(cpu_milli=1000, num_gpu=2, gpu_milli=1000) == [False, False, True, False]  # whole devices only
    assert feas(cpu_milli=1000, num_gpu=1, gpu_milli=900) == [False, True, True, True]
    assert feas(cpu_milli=1000, num_gpu=1, gpu_milli=950) == [False, True, True, True]
    c.allocate(Pod("s2", 0, 0, 1, 200), 1, (1,))
    assert feas(cpu_milli=1000, num_gpu=1, gpu_milli=900) == [False, True, True, True]  # device 0 has 900
    assert feas(cpu_milli=1000, num_gpu=1, gpu_milli=901) == [False, False, True, True]


def test_pod_count_limit():
    c = Cluster(["n"], [64000], [1000], [1], ["T4"], max_pods=2)
    c.allocate(Pod("a", 1), 0)
    c.allocate(Pod("b", 1), 0)
    assert not c.feasible(Pod("c", 1))[0]
    with pytest.raises(ValueError):
        c.allocate(Pod("c", 1), 0)


def test_allocate_release_roundtrip_and_errors():
    c = make_cluster([("n0", 8000, 1000, 2, "T4")])
    before = (c.cpu_free.copy(), c.mem_free.copy(), c.gpu_free.copy(), c.tag_count.copy())
    pod = Pod("p", 3000, 200, 1, 400)
    c.allocate(pod, Placement(0, "n0", (1,)))
    assert c.gpu_free[0].tolist() == [1000, 600] and c.gpu_milli_allocated == 400 and c.tag_count[0, 0] == 1
    with pytest.raises(ValueError):
        c.allocate(pod, Placement(0, "n0", (0,)))  # already bound
    with pytest.raises(ValueError):
        c.allocate(Pod("q", 1000, 0, 1, 700), 0, (1,))  # device 1 has 600
    with pytest.raises(ValueError):
        c.allocate(Pod("r", 1000, 0, 1, 500), 0, ())  # GPU pod needs its devices
    c.release("p")
    after = (c.cpu_free, c.mem_free, c.gpu_free, c.tag_count)
    assert all((a == b).all() for a, b in zip(before, after)) and c.gpu_milli_allocated == 0
    with pytest.raises(KeyError):
        c.release("p")


def test_copy_is_independent():
    c = make_cluster([("n0", 8000, 1000, 2, "T4")])
    d = c.copy()
    d.allocate(Pod("p", 1000, 0, 1, 500), 0, (0,))
    assert c.gpu_free[0].tolist() == [1000, 1000] and not c.bindings and "p" in d.bindings


# ------------------------------------------------------------------------------------------------ scores
def test_bestfit_scores_and_gpu_choice():
    c = make_cluster([("a", 64000, 1000, 2, "T4"), ("b", 128000, 1000, 8, "T4")])
    set_free(c, 0, [600, 300])
    pod = Pod("p", 8000, 0, 1, 250)
    # a: 0.5*(56000/128000) + 0.5*(650/8000) = 0.259375 -> int(74.06) = 74; b: 0.5*120/128 + 0.5*7750/8000
    assert BestFit().score(c, pod, np.array([0, 1])).tolist() == [74, 4]
    assert BestFit().place(c, pod) == Placement(0, "a", (1,), 74)  # least free device that fits
    assert BestFit().select_gpus(c, Pod("w", 1, 0, 2, 1000), 1) == (0, 1)


def test_dotprod_scores():
    c = make_cluster([("a", 64000, 1000, 2, "T4"), ("b", 128000, 1000, 8, "T4")])
    pod = Pod("p", 32000, 0, 1, 1000)
    # a: (0.5*0.25 + 0.25*0.125)/2 = 0.078125 -> 92; b: (1*0.25 + 1*0.125)/2 = 0.1875 -> 81
    assert DotProd().score(c, pod, np.array([0, 1])).tolist() == [92, 81]


def test_gpupacking_cases():
    c = make_cluster(
        [
            ("idle8", 64000, 1000, 8, "T4"),
            ("idle2", 64000, 1000, 2, "T4"),
            ("shared", 64000, 1000, 4, "T4"),
            ("used", 64000, 1000, 4, "T4"),
        ]
    )
    set_free(c, 2, [400, 1000, 1000, 1000])
    set_free(c, 3, [0, 100, 1000, 1000])
    nodes = np.arange(4)
    gp = GpuPacking()
    # idle nodes: max(33 - n, n); shared: 100 - (400*100/1000)/10 = 96; used node must take a free device: 49
    assert gp.score(c, Pod("s", 1, 0, 1, 300), nodes).tolist() == [25, 31, 96, 49]
    assert gp.score(c, Pod("w", 1, 0, 2, 1000), nodes).tolist() == [25, 31, 48, 48]
    assert gp.score(c, Pod("cpu", 1), nodes).tolist() == [0, 0, 0, 0]


def test_gpuclustering_cases():
    c = make_cluster(
        [
            ("empty", 64000, 1000, 8, "T4"),
            ("same", 64000, 1000, 8, "T4"),
            ("mixed", 64000, 1000, 8, "T4"),
            ("other", 64000, 1000, 8, "T4"),
        ]
    )
    c.allocate(Pod("s1", 1, 0, 1, 500), 1, (0,))
    c.allocate(Pod("s2", 1, 0, 1, 500), 2, (0,))
    c.allocate(Pod("w2", 1, 0, 2, 1000), 2, (1, 2))
    c.allocate(Pod("w1", 1, 0, 1, 1000), 3, (0,))
    c.allocate(Pod("cpu", 1), 0)  # CPU-only pods carry no tag
    # base = 25 * (8000 - free) // 8000: empty 0, same 1, mixed 7, other 3
    scores = GpuClustering().score(c, Pod("p", 1, 0, 1, 300), np.arange(4)).tolist()
    assert scores == [25, 1 + 75, 7 + 50, 3 + 0]


def test_fgd_score_by_hand_and_shared_device_choice():
    wl = TargetWorkload.from_specs([(1000, 500, 1)], [1.0])
    c = make_cluster([("n0", 8000, 1000, 2, "T4")])
    set_free(c, 0, [1000, 700])
    fgd = FGD(wl)
    # device 0: 1000 -> 500, free [500, 700]: nothing too small, dF = 0 -> 50
    # device 1: 700 -> 200, free [1000, 200]: the 200 device is a fragment, dF = -200 -> int(100*sig(-0.2)) = 45
    assert fgd.place(c, Pod("p", 1000, 0, 1, 500)) == Placement(0, "n0", (0,), None)
    nodes = np.array([0])
    assert fgd.score(c, Pod("p", 1000, 0, 1, 500), nodes).tolist() == [50]
    # where device 1 alone fits (device 0 keeps 300 < 500, a fragment already), its score is the node's:
    # 700 -> 200 makes 200 more of fragment, dF = -200
    alone = make_cluster([("n1", 8000, 1000, 2, "T4")])
    set_free(alone, 0, [300, 700])
    assert fgd.score(alone, Pod("p", 1000, 0, 1, 500), nodes).tolist() == [int(100 / (1 + math.exp(0.2)))]
    assert fgd.place(alone, Pod("p", 1000, 0, 1, 500)).gpus == (1,)
    # q: device 0 (1000 -> 700) keeps F at 0: 50; device 1 (700 -> 400 < 500) adds 400: 40
    assert fgd.score(c, Pod("q", 1000, 0, 1, 300), nodes).tolist() == [50]


def test_fgd_device_ties_go_to_lowest_index():
    wl = TargetWorkload.from_specs([(1000, 200, 1)], [1.0])
    c = make_cluster([("n0", 8000, 1000, 4, "T4")])
    set_free(c, 0, [1000, 600, 1000, 600])
    placement = FGD(wl).place(c, Pod("p", 1000, 0, 1, 300))
    assert placement.gpus == (0,)  # all four devices keep F at 0 (score 50): the first wins


def test_node_ties_go_to_lowest_rank():
    specs = [("a", 8000, 1000, 1, "T4"), ("b", 8000, 1000, 1, "T4"), ("c", 8000, 1000, 1, "T4")]
    wl = TargetWorkload.from_specs([(1000, 500, 1)], [1.0])
    pod = Pod("p", 1000, 0, 1, 500)
    for policy in (FGD(wl), BestFit(), DotProd(), GpuPacking(), GpuClustering()):
        c = make_cluster(specs, ranks=[2, 0, 1])
        assert policy.place(c, pod).node_name == "b", policy
        c = make_cluster(specs, ranks=[1, 2, 0])
        assert policy.place(c, pod).node_name == "c", policy


def test_single_feasible_node_skips_scoring_and_none_when_nothing_fits():
    c = make_cluster([("a", 8000, 1000, 1, "T4"), ("b", 1000, 1000, 1, "T4")])
    assert BestFit().place(c, Pod("p", 4000, 0, 1, 500)) == Placement(0, "a", (0,), None)
    assert BestFit().place(c, Pod("q", 9000)) is None
    assert BestFit().schedule(c, Pod("r", 4000, 0, 1, 500)).node == 0 and "r" in c.bindings


def test_random_policy_is_seeded_and_feasible():
    c = make_cluster([(f"n{i}", 8000, 1000, 2, "T4") for i in range(20)])
    picks = [RandomFit(seed=3).place(c, Pod("p", 1000, 0, 1, 500)) for _ in range(2)]
    assert picks[0] == picks[1]
    policy = RandomFit(seed=1)
    for i in range(60):
        pod = Pod(f"p{i}", 500, 0, 1, 300)
        pl = policy.schedule(c, pod)
        assert pl is not None and c.gpu_free[pl.node].min() >= 0


def test_make_policy():
    wl = TargetWorkload.from_specs([(1000, 500, 1)], [1.0])
    assert isinstance(make_policy("FGD", workload=wl), FGD)
    assert isinstance(make_policy("best-fit"), BestFit)
    with pytest.raises(ValueError):
        make_policy("fgd")
    with pytest.raises(ValueError):
        make_policy("first-fit")


def test_policy_registry():
    assert POLICY_NAMES == ("random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd")
    assert DISPLAY_NAMES == {
        "random": "Random",
        "dotprod": "DotProd",
        "gpuclustering": "GpuClustering",
        "gpupacking": "GpuPacking",
        "bestfit": "BestFit",
        "fgd": "FGD",
    }
    wl = TargetWorkload.from_specs([(1000, 500, 1)], [1.0])
    for name in POLICY_NAMES:
        policy = make_policy(name.upper(), workload=wl, seed=0)
        assert type(policy) is POLICIES.factory(name) and policy.name == name
    assert isinstance(make_policy("Gpu_Packing"), GpuPacking)
    with pytest.raises(UnknownNameError, match="unknown packing policy 'firstfit'; known: random, dotprod") as err:
        make_policy("first-fit")
    assert isinstance(err.value, KeyError)
    a, b = make_policy("random", seed=7), make_policy("random", seed=7)
    assert a.rng.integers(1 << 30) == b.rng.integers(1 << 30)


# ------------------------------------------------------------------------------------------------ cross-check
def _ref_fgd_place(c: Cluster, pod: Pod, wl: TargetWorkload):
    """The spec's FGD, per node in plain Python."""
    best = None
    for n in range(c.n_nodes):
        free = [int(x) for x in c.gpu_free[n, : c.gpu_count[n]]]
        model = c.model_names[c.model_id[n]]
        cpu = int(c.cpu_free[n])
        fits = [i for i, x in enumerate(free) if x >= pod.gpu_milli] if pod.num_gpu else []
        if (
            cpu < pod.cpu_milli
            or c.mem_free[n] < pod.memory_mib
            or (pod.num_gpu and (not free or not pod.allows_model(model) or len(fits) < pod.num_gpu))
        ):
            continue
        f0 = node_frag_scalar(cpu, free, model, wl)

        def score(after):
            f1 = node_frag_scalar(cpu - pod.cpu_milli, after, model, wl)
            return int(1.0 / (1.0 + math.exp(-((f0 - f1) / 1000))) * 100)

        if pod.is_shared:
            s, gpu = None, None
            for i in fits:
                after = list(free)
                after[i] -= pod.gpu_milli
                si = score(after)
                if s is None or si > s:
                    s, gpu = si, (i,)
        else:
            after, need = list(free), pod.num_gpu
            for i in sorted(range(len(free)), key=lambda j: free[j]):
                if need and free[i] >= pod.gpu_milli:
                    after[i] -= pod.gpu_milli
                    need -= 1
            s = score(after)
            gpu = tuple(i for i, x in enumerate(free) if x == 1000)[: pod.num_gpu]
        key = (s, -int(c.tiebreak_rank[n]))
        if best is None or key > best[0]:
            best = (key, n, gpu)
    return None if best is None else (best[1], best[2])


def _ref_gpupacking(c: Cluster, pod: Pod, n: int) -> int:
    free = [int(x) for x in c.gpu_free[n, : c.gpu_count[n]]]
    full = sum(1 for x in free if x == 1000)
    if full == len(free):
        return max(33 - full, full)
    used, need = [], pod.num_gpu
    for i in sorted(range(len(free)), key=lambda j: free[j]):
        if need and free[i] >= pod.gpu_milli:
            used.append(free[i])
            need -= 1
    full_used = sum(1 for x in used if x == 1000)
    if full_used:
        return max(50 - full_used, 33)
    return max(100 - sum(x * 100 // 1000 for x in used) // 10, 50)


def test_vectorized_policies_match_plain_code_on_random_clusters():
    rng = np.random.default_rng(11)
    models = ["T4", "V100M16", "P100"]
    specs = [
        (
            f"n{i:02d}",
            int(rng.choice([32000, 64000, 96000])),
            262144,
            int(rng.choice([1, 2, 4, 8])),
            str(rng.choice(models)),
        )
        for i in range(40)
    ]
    shapes = [
        (1000, 250, 1),
        (4000, 500, 1),
        (8000, 1000, 1),
        (16000, 1000, 2),
        (6000, 0, 0),
        (2000, 810, 1),
        (12000, 1000, 4),
        (3000, 470, 1),
    ]
    wl = TargetWorkload.from_specs(shapes[:6], rng.dirichlet(np.ones(6)))
    c = make_cluster(specs, ranks=rng.permutation(len(specs)))
    fgd = FGD(wl)
    checked = 0
    for i in range(300):
        cpu, g, k = shapes[int(rng.integers(len(shapes)))]
        spec = "V100M16|P100" if rng.random() < 0.15 else ""
        pod = Pod(f"p{i}", cpu, int(rng.integers(0, 20000)), k, g, spec)
        placement = fgd.place(c, pod)
        want = _ref_fgd_place(c, pod, wl)
        assert (None if placement is None else (placement.node, placement.gpus)) == want, i
        feasible = np.flatnonzero(c.feasible(pod))
        if pod.num_gpu and len(feasible):
            got = GpuPacking().score(c, pod, feasible).tolist()
            assert got == [_ref_gpupacking(c, pod, int(n)) for n in feasible]
        if placement is not None:
            c.allocate(pod, placement)
            checked += 1
        if i % 7 == 6 and c.bindings:  # releases too, so the caches see both directions
            c.release(next(iter(c.bindings)))
    assert checked > 100


def test_copy_keeps_fragmentation_exact():
    wl = TargetWorkload.from_specs([(1000, 600, 1)], [1.0])
    c = make_cluster([("a", 8000, 100, 1, "T4"), ("b", 8000, 100, 1, "T4")])
    c.allocate(Pod("p", 1000, 0, 1, 500), 0, (0,))
    assert c.fragmentation(wl) == 500.0
    d = c.copy()
    d.allocate(Pod("q", 1000, 0, 1, 500), 1, (0,))
    assert d.fragmentation(wl) == 1000.0 and c.fragmentation(wl) == 500.0
    assert FGD(wl).place(d, Pod("r", 1000, 0, 1, 400)).node == 0 and d.bindings.keys() == {"p", "q"}


def test_held_milli_counts_the_device_share_jobs_of_one_size_leave_unusable():
    """A device shared by jobs of one size fits floor(1000 / m) of them, so each holds 1000 / floor(1000 / m):
    the remainder no such job fits counts as held; whole-GPU shares stay as they are."""
    from scheduling.packing.pods import held_milli

    assert held_milli(470) == 500.0  # two per device
    assert held_milli(810) == 1000.0  # the 190 left fit no 810-milli job
    assert held_milli(300) == pytest.approx(1000 / 3)
    assert held_milli(250) == 250.0 and held_milli(1000) == 1000.0
    np.testing.assert_allclose(held_milli(np.array([50, 460, 600, 1000])), [50.0, 500.0, 1000.0, 1000.0])
