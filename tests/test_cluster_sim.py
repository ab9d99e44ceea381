"""The cluster simulation (benchmarks/cluster_sim.py): failures turn into fake zeros only under `zero`, never under
`requeue`; spread puts a group on distinct nodes, pack on one."""

import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import cluster_sim  # noqa: E402

TINY = cluster_sim.Sim(nodes=4, slots=2, groups=2, group_size=4, repair_s=10.0, retries=1, steps=1)


def test_without_failures_every_rollout_is_done_and_the_step_lasts_its_longest_rollout():
    sim = cluster_sim.Sim(**{**TINY.__dict__, "mtbf_h": 1e9})
    step = cluster_sim.one_step(sim, [5.0, 7.0], "spread", "zero", random.Random(0))
    assert step["lost"] == step["fake_zeros"] == step["unscored"] == 0
    assert step["wall_s"] == 7.0  # 8 draws of {5, 7}, seeded: 7 among them


def test_a_lost_rollout_is_a_fake_zero_only_under_zero_and_requeue_never_scores_one():
    # a node fails every ~36 s on average while a rollout takes 100 s: most are lost at least once
    sim = cluster_sim.Sim(**{**TINY.__dict__, "mtbf_h": 0.01})
    zero = cluster_sim.one_step(sim, [100.0], "spread", "zero", random.Random(1))
    requeue = cluster_sim.one_step(sim, [100.0], "spread", "requeue", random.Random(1))
    assert zero["fake_zeros"] == zero["lost"] > 0 and zero["unscored"] == 0
    assert requeue["fake_zeros"] == 0 and requeue["unscored"] > 0  # past its one retry: unscored, never a 0
    assert requeue["groups_corrupted"] == 0 and zero["groups_corrupted"] > 0


def test_pack_loses_whole_groups_where_spread_spreads_the_loss():
    # one group of 4 on 4 nodes x 4 slots, one failure early in the step: pack holds the group on one node
    sim = cluster_sim.Sim(nodes=4, slots=4, groups=1, group_size=4, mtbf_h=1e9, steps=1)

    class FirstNodeDiesAt1(random.Random):
        def expovariate(self, lambd):  # node 0's first failure at t = 1, the others never
            self.calls = getattr(self, "calls", 0) + 1
            return 1.0 if self.calls == 1 else 1e12

    pack = cluster_sim.one_step(sim, [10.0], "pack", "zero", FirstNodeDiesAt1())
    spread = cluster_sim.one_step(sim, [10.0], "spread", "zero", FirstNodeDiesAt1())
    assert pack["groups_lost_whole"] == 1 and pack["fake_zeros"] == 4
    assert spread["groups_lost_whole"] == 0 and spread["fake_zeros"] == 1
