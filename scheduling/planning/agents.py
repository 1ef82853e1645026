"""Cluster agents: each packs the jobs the coordinator offers onto its nodes and GPU devices with a packing policy
(FGD by default, `scheduling.packing`) and rejects what does not fit.

Time model (the simplest honest one): the coordinator reasons about capacity over time as GPU-milli per cluster
and hour. The agent holds the *actual* node/device state (`cluster`, a `scheduling.packing.Cluster`) with the jobs
running now. A job the coordinator starts in the current hour is offered with `offer()`: the agent places it
with the packing policy and binds it, or rejects it (no node has the CPU, memory and per-device GPU share it
needs: fragmentation the GPU-milli view cannot see); the coordinator then re-offers the job to its next-best
candidate. Jobs starting in a later hour get a *tentative* node from `tentative()`: a copy of the cluster is
rolled forward hour by hour (jobs whose end hour has passed are released, the tentative jobs starting in that
hour are packed in the coordinator's order); tentative nodes are advisory, since every hourly plan is made
again from the state of that hour.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scheduling.packing import MILLI, Cluster, Placement, Pod, TargetWorkload, make_policy

STANDBY = "__standby__"  # holder of a node kept for multi-GPU jobs (`ClusterAgent.keep_standby`)


@dataclass
class AgentStats:
    offered: int = 0
    accepted: int = 0
    rejected: int = 0
    tentative_ok: int = 0
    tentative_failed: int = 0


class ClusterAgent:
    """One cluster's agent. `end_hour[job_id]` is the absolute hour (int, hours since the epoch) at which a
    bound job frees its resources."""

    def __init__(
        self, name: str, cluster: Cluster, workload: TargetWorkload | None = None, policy: str = "fgd", seed: int = 0
    ):
        self.name = name
        self.cluster = cluster
        self.policy_name = policy
        self.policy = make_policy(policy, workload=workload, seed=seed)
        self.end_hour: dict[str, int] = {}
        self.reserved: dict[int, tuple[str, int]] = {}  # node -> (job holding it, hour its running jobs end)
        self.standby_job_gpus = 2  # jobs of this many GPUs or more may use a standby node (`keep_standby`)
        self.stats = AgentStats()

    def offer(self, pod: Pod, end_hour: int, *, open_standby: bool = False) -> Placement | None:
        """Place and bind `pod` now (None = rejected). Nodes reserved for another job are off limits unless
        the pod ends before the node drains (backfill). `open_standby`: standby nodes are open to this pod too
        (a job due now that no other node takes: a deadline outranks the standby's purpose)."""
        self.stats.offered += 1
        placement = self.policy.place(self.cluster, pod, self._held_against(pod, int(end_hour), open_standby))
        if placement is None:
            self.stats.rejected += 1
            return None
        self.cluster.allocate(pod, placement)
        self.end_hour[pod.pod_id] = int(end_hour)
        self.stats.accepted += 1
        self.cancel_reservation(pod.pod_id)
        return placement

    def evict_for(self, pod: Pod, end_hour: int, evictable: dict[str, float]) -> tuple[Placement, list[str]] | None:
        """Preemption (the Kubernetes scheduler's PostFilter, Slurm's preempt/requeue), for a job no node can take
        now: on each node where evicting running jobs of `evictable` (job id -> cost of evicting it) makes room,
        the cheapest set of them that does (all of the node's evictable jobs, then each put back, costliest first,
        while the job still fits); the node whose set costs least wins. Its victims are released and `pod` bound
        there. Returns (placement, victim ids), or None when no such node exists (nothing changes then)."""
        cl = self.cluster
        held = self._held_against(pod, int(end_hour))
        on_node: dict[int, list[str]] = {}
        for job_id, b in cl.bindings.items():
            if job_id in evictable and (held is None or not held[b.node]):
                on_node.setdefault(b.node, []).append(job_id)
        best = None
        for node, ids in on_node.items():
            removed = [cl.release(i) for i in ids]
            try:
                if not cl.can_host(pod, node):
                    continue
                keep = []
                for b in sorted(removed, key=lambda b: -evictable[b.pod.pod_id]):
                    cl.allocate(b.pod, b.node, b.gpus)
                    if cl.can_host(pod, node):
                        keep.append(b)
                    else:
                        cl.release(b.pod.pod_id)
                for b in keep:
                    cl.release(b.pod.pod_id)
                victims = [b.pod.pod_id for b in removed if b not in keep]
                cost = sum(evictable[v] for v in victims)
                if best is None or (cost, cl.tiebreak_rank[node]) < (best[0], cl.tiebreak_rank[best[1]]):
                    best = (cost, node, victims)
            finally:  # the what-if is undone: every evictable job of the node is bound again
                for b in removed:
                    cl.allocate(b.pod, b.node, b.gpus)
        if best is None:
            return None
        _, node, victims = best
        for job_id in victims:
            self.release(job_id)
        others = np.ones(cl.n_nodes, dtype=bool)
        others[node] = False
        placement = self.policy.place(cl, pod, others)
        if placement is None:  # cannot happen: can_host said it fits
            raise RuntimeError(f"{self.name}: {pod.pod_id} does not fit on node {cl.names[node]} after eviction")
        cl.allocate(pod, placement)
        self.end_hour[pod.pod_id] = int(end_hour)
        self.stats.offered += 1
        self.stats.accepted += 1
        self.cancel_reservation(pod.pod_id)
        return placement, victims

    # ------------------------------------------------------------------ reservations
    def _held_against(self, pod: Pod, end_hour: int, open_standby: bool = False) -> np.ndarray | None:
        if not self.reserved:
            return None
        held = np.zeros(self.cluster.n_nodes, dtype=bool)
        for node, (holder, until_h) in self.reserved.items():
            if holder == pod.pod_id or (holder == STANDBY and (open_standby or pod.num_gpu >= self.standby_job_gpus)):
                continue  # its own node; a standby node is kept for exactly these multi-GPU jobs
            held[node] = end_hour > until_h
        return held if held.any() else None

    def standby_nodes(self) -> list[int]:
        return [n for n, (holder, _) in self.reserved.items() if holder == STANDBY]

    def keep_standby(self, n_nodes: int, until_h: int, job_gpus: int = 2) -> list[int]:
        """Keep `n_nodes` nodes of the cluster's largest shape on standby for jobs of `job_gpus` GPUs or more (a pool
        the planner's LP gives only to them): other jobs may use a standby node only if they end by `until_h`.
        Standby nodes, once chosen, stay (the largest in CPU and memory, then those that drain first, are chosen).
        Returns their indices."""
        self.standby_job_gpus = int(job_gpus)
        mine = self.standby_nodes()
        for node in mine:
            self.reserved[node] = (STANDBY, int(until_h))
        cl = self.cluster
        if len(mine) < n_nodes and cl.n_nodes:
            drained = self._drained_hours()
            cand = [n for n in np.flatnonzero(cl.gpu_count == cl.gpu_count.max()) if n not in self.reserved]
            # the node with the most CPU and memory first: it hosts the most whole-node jobs (an 8-GPU job asking
            # for 64.2 cores fits no 64-core node); then the one that drains first
            cand.sort(key=lambda n: (-cl.cpu_capacity[n], -cl.mem_capacity[n], drained[n], cl.tiebreak_rank[n]))
            for node in cand[: n_nodes - len(mine)]:
                self.reserved[int(node)] = (STANDBY, int(until_h))
        return self.standby_nodes()

    def node_usage(self, nodes: list[int], now_h: int, hours: int) -> np.ndarray:
        """(hours,) GPU-milli the running jobs use on `nodes` in each hour from `now_h` (until their end hour)."""
        used = np.zeros(hours + 1, dtype=np.int64)
        wanted = set(int(n) for n in nodes)
        for job_id, b in self.cluster.bindings.items():
            if b.node in wanted and b.pod.num_gpu:
                end = min(max(self.end_hour.get(job_id, now_h) - now_h, 0), hours)
                milli = b.pod.gpu_milli * len(b.gpus)
                used[0] += milli
                used[end] -= milli
        return np.cumsum(used)[:hours]

    def drain_option(self, pod: Pod, max_reserved: int = 1) -> tuple[int, int] | None:
        """(node, hour its running jobs end) of the node `reserve` would hold for `pod`: among the nodes that can
        host it once empty, the one that drains first. None: no node ever can, or the cluster already holds
        `max_reserved` nodes for other jobs."""
        cl = self.cluster
        mine = [n for n, (holder, _) in self.reserved.items() if holder == pod.pod_id]
        if mine:
            return mine[0], self._drained_hours()[mine[0]]
        if len(self.reserved) >= max_reserved:
            return None
        can = (cl.cpu_capacity >= pod.cpu_milli) & (cl.mem_capacity >= pod.memory_mib)
        if pod.num_gpu:
            can &= cl.gpu_count >= pod.num_gpu
            if pod.gpu_models:
                can &= cl.model_mask(pod)[cl.model_id]
        if self.reserved:
            can[list(self.reserved)] = False
        if not can.any():
            return None
        drained = self._drained_hours()
        cand = np.flatnonzero(can)
        node = int(cand[np.lexsort((cl.tiebreak_rank[cand], drained[cand]))[0]])
        return node, int(drained[node])

    def _drained_hours(self) -> np.ndarray:
        """(nodes,) the hour each node's running jobs have all ended (0: empty now)."""
        drained = np.zeros(self.cluster.n_nodes, dtype=np.int64)
        for job_id, binding in self.cluster.bindings.items():
            drained[binding.node] = max(drained[binding.node], self.end_hour.get(job_id, 0))
        return drained

    def reserve(self, pod: Pod, max_reserved: int = 1, until_h: int | None = None) -> str | None:
        """Hold a node for `pod`, a job that no node can take now although the cluster's free GPUs may add up (a
        multi-GPU job starves while small jobs keep refilling every node; Slurm's backfill reservation): the
        node of `drain_option`. From then on no other job is placed there unless it ends by the hour the node
        drains, or by `until_h` when that is later (the hour the job is planned to start: the node may serve
        jobs that end before then). Returns the node's name (None: see `drain_option`)."""
        opt = self.drain_option(pod, max_reserved)
        if opt is None:
            return None
        node, drained_h = opt
        self.reserved[node] = (pod.pod_id, drained_h if until_h is None else max(drained_h, int(until_h)))
        return self.cluster.names[node]

    def cancel_reservation(self, job_id: str) -> None:
        for node in [n for n, (holder, _) in self.reserved.items() if holder == job_id]:
            del self.reserved[node]

    def release(self, job_id: str) -> None:
        self.cluster.release(job_id)
        self.end_hour.pop(job_id, None)

    def release_finished(self, hour: int) -> list[str]:
        """Release every bound job whose end hour is <= `hour`; returns their ids."""
        done = [j for j, e in self.end_hour.items() if e <= hour]
        for j in done:
            self.release(j)
        return done

    def tentative(self, requests: list[tuple[Pod, int, int]]) -> dict[str, Placement | None]:
        """Tentative placements for future starts: `requests` = [(pod, start_hour, end_hour)] in the
        coordinator's order. Works on a copy; the live cluster is unchanged."""
        if not requests:
            return {}
        sim = self.cluster.copy()
        ends = dict(self.end_hour)
        out: dict[str, Placement | None] = {}
        by_start: dict[int, list[tuple[Pod, int]]] = {}
        for pod, start, end in requests:
            by_start.setdefault(int(start), []).append((pod, int(end)))
        for hour in sorted(by_start):
            for j in [j for j, e in ends.items() if e <= hour]:
                if j in sim.bindings:
                    sim.release(j)
                ends.pop(j)
            for pod, end in by_start[hour]:
                pl = self.policy.place(sim, pod)
                out[pod.pod_id] = pl
                if pl is None:
                    self.stats.tentative_failed += 1
                    continue
                sim.allocate(pod, pl)
                ends[pod.pod_id] = end
                self.stats.tentative_ok += 1
        return out

    @property
    def gpu_milli_allocated(self) -> int:
        return int(self.cluster.gpu_milli_allocated)

    def free_breakdown(self) -> tuple[int, int, int]:
        """Where the cluster's free GPU-milli is now: (on whole free devices, on partly used devices, on standby
        nodes). The middle part is device fragmentation: shares that only jobs small enough can use, which the
        planner's and the bound's GPU-milli capacity count as usable by any job. The three add up to the free
        GPU-milli."""
        cl = self.cluster
        standby = np.zeros(cl.n_nodes, dtype=bool)
        standby[self.standby_nodes()] = True
        free = np.where(cl.gpu_exists, cl.gpu_free, 0)
        rest = free[~standby]
        whole = int(rest[rest >= MILLI].sum())
        return whole, int(rest.sum()) - whole, int(free[standby].sum())


def default_workload(pods: list[Pod] | None = None) -> TargetWorkload | None:
    """FGD's target workload: the typical pods of the job trace (None -> FGD cannot be used)."""
    if not pods:
        return None
    return TargetWorkload.from_pods(pods)


def make_agents(fleet, workload: TargetWorkload | None, policy: str = "fgd", seed: int = 0) -> list[ClusterAgent]:
    """One agent per fleet cluster with fresh (empty) node state."""
    if workload is None and policy == "fgd":
        workload = TargetWorkload.from_specs([(8000, 1000, 1), (4000, 500, 1)], [0.5, 0.5])
    return [
        ClusterAgent(c.name, fleet.packing_cluster(i), workload, policy, seed) for i, c in enumerate(fleet.clusters)
    ]


def job_pods(jobs) -> list[Pod]:
    """`scheduling.packing.Pod` per job row (id, CPU, memory, GPU count, per-GPU milli, GPU model constraint)."""
    ids = jobs["job_id"].astype(str).tolist()
    cols = [jobs[c].to_numpy() for c in ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli")]
    specs = jobs["gpu_spec"].fillna("").astype(str).tolist()
    return [Pod(i, int(c), int(m), int(k), int(g), s) for i, c, m, k, g, s in zip(ids, *cols, specs)]


def used_milli(agents: list[ClusterAgent]) -> np.ndarray:
    return np.array([a.gpu_milli_allocated for a in agents], dtype=np.int64)
