"""Expert placement: which GPU owns each routed expert under expert parallelism."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Placement:
    """A map expert -> owning GPU, with every expert owned by exactly one GPU.

    owner: int array [num_experts], owner[e] in [0, num_gpus).
    """

    owner: np.ndarray
    num_gpus: int
    kind: str = "explicit"

    def __post_init__(self) -> None:
        owner = np.asarray(self.owner)
        if owner.ndim != 1 or owner.size == 0:
            raise ValueError("placement: owner must be a non-empty 1-D array")
        if not np.issubdtype(owner.dtype, np.integer):
            raise ValueError(f"placement: owner must be integer, got {owner.dtype}")
        if self.num_gpus <= 0:
            raise ValueError("placement: num_gpus must be positive")
        if owner.min() < 0 or owner.max() >= self.num_gpus:
            raise ValueError(f"placement: owners must lie in [0, {self.num_gpus})")
        object.__setattr__(self, "owner", owner.astype(np.int64))

    @property
    def num_experts(self) -> int:
        return int(self.owner.size)

    def local_experts(self, gpu: int) -> np.ndarray:
        """Global ids of the experts on `gpu`, ascending; their index in this array is the local id."""
        return np.flatnonzero(self.owner == gpu)

    def local_index(self) -> np.ndarray:
        """int array [num_experts]: position of each expert among its owner's experts."""
        idx = np.empty(self.num_experts, dtype=np.int64)
        for g in range(self.num_gpus):
            le = self.local_experts(g)
            idx[le] = np.arange(le.size)
        return idx

    def experts_per_gpu(self) -> np.ndarray:
        return np.bincount(self.owner, minlength=self.num_gpus)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "num_gpus": self.num_gpus, "owner": self.owner.tolist()}


def contiguous(num_experts: int, num_gpus: int) -> Placement:
    """Experts [g*E/G, (g+1)*E/G) on GPU g; E must be a multiple of G (as in every EP deployment)."""
    _check_divisible(num_experts, num_gpus)
    per = num_experts // num_gpus
    return Placement(np.arange(num_experts) // per, num_gpus, "contiguous")


def round_robin(num_experts: int, num_gpus: int) -> Placement:
    """Expert e on GPU e % G."""
    _check_divisible(num_experts, num_gpus)
    return Placement(np.arange(num_experts) % num_gpus, num_gpus, "round-robin")


def explicit(owner, num_gpus: int) -> Placement:
    """A user-given owner list; every expert must have exactly one owner in range."""
    return Placement(np.asarray(owner), num_gpus, "explicit")


def balanced(loads, num_gpus: int) -> Placement:
    """Experts spread so that every GPU gets the same number of experts and as even a load as a greedy pass finds:
    heaviest expert first (ties: lower id), each to the GPU with the least load so far among those with room
    (ties: lower GPU). loads: per-expert load [num_experts] (e.g. routed pairs); E must be a multiple of G."""
    loads = np.asarray(loads, dtype=np.float64)
    if loads.ndim != 1 or loads.size == 0 or not np.all(np.isfinite(loads)) or loads.min() < 0:
        raise ValueError("balanced placement: loads must be a non-empty 1-D array of finite values >= 0")
    _check_divisible(loads.size, num_gpus)
    per = loads.size // num_gpus
    owner = np.empty(loads.size, dtype=np.int64)
    total, count = np.zeros(num_gpus), np.zeros(num_gpus, dtype=np.int64)
    for e in np.argsort(-loads, kind="stable"):
        room = np.flatnonzero(count < per)
        g = int(room[np.argmin(total[room])])
        owner[e], total[g], count[g] = g, total[g] + loads[e], count[g] + 1
    return Placement(owner, num_gpus, "balanced")


def balanced_per_layer(routing, num_experts: int, num_gpus: int) -> list[Placement]:
    """One `balanced` placement per layer of routing int [num_tokens, num_layers, top_k], from that layer's pairs
    per expert: the batch's own loads, so an upper bound on what a placement from past statistics achieves."""
    routing = np.asarray(routing)
    if routing.ndim != 3:
        raise ValueError(f"routing must be [num_tokens, num_layers, top_k], got shape {routing.shape}")
    return [balanced(expert_loads(routing[:, layer, :], num_experts), num_gpus) for layer in range(routing.shape[1])]


def expert_loads(ids, num_experts: int) -> np.ndarray:
    """Routed (token, expert) pairs per expert of int expert ids of any shape, ids in [0, num_experts)."""
    ids = np.asarray(ids).ravel()
    if ids.size and (ids.min() < 0 or ids.max() >= num_experts):
        raise ValueError(f"expert ids must lie in [0, {num_experts})")
    return np.bincount(ids, minlength=num_experts)


def placement_for(placement, layer: int) -> Placement:
    """The placement of layer `layer` (a position along the routing's layer axis): `placement` itself, or its
    entry `layer` when it is a sequence of per-layer placements."""
    if isinstance(placement, Placement):
        return placement
    if not 0 <= layer < len(placement):
        raise ValueError(f"no placement for layer {layer}: {len(placement)} per-layer placements given")
    return placement[layer]


PLACEMENTS = ("contiguous", "round-robin", "balanced")


def make_placement(kind: str, num_experts: int, num_gpus: int, owner=None, loads=None) -> Placement:
    """Build a placement by name: 'contiguous', 'round-robin', 'explicit' (with `owner`) or 'balanced' (with the
    per-expert `loads`, e.g. np.bincount of a layer's routed expert ids)."""
    if kind == "balanced":
        if loads is None:
            raise ValueError("balanced placement needs the experts' loads")
        if len(loads) != num_experts:
            raise ValueError(f"balanced placement: {len(loads)} loads for {num_experts} experts")
        return balanced(loads, num_gpus)
    if kind == "contiguous":
        return contiguous(num_experts, num_gpus)
    if kind == "round-robin":
        return round_robin(num_experts, num_gpus)
    if kind == "explicit":
        if owner is None:
            raise ValueError("explicit placement needs an owner list")
        p = explicit(owner, num_gpus)
        if p.num_experts != num_experts:
            raise ValueError(f"explicit placement has {p.num_experts} experts, model has {num_experts}")
        return p
    raise ValueError(f"unknown placement {kind!r}; use contiguous, round-robin, balanced or explicit")


def _check_divisible(num_experts: int, num_gpus: int) -> None:
    if num_gpus <= 0:
        raise ValueError("num_gpus must be positive")
    if num_experts % num_gpus:
        raise ValueError(f"{num_experts} experts do not split evenly over {num_gpus} GPUs")
