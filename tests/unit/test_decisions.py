"""Role decisions for one (plan, instance) from hand-written observations (pure, no PostgreSQL)."""

from __future__ import annotations

from tandem.supervisor.decisions import (
    ACTIVE,
    BACKUP,
    COLD,
    HOT,
    MAX_LAUNCHES,
    PASSIVE,
    WARM,
    AwaitPromotion,
    Block,
    Blocked,
    HandOver,
    Launch,
    LeaseView,
    InstanceView,
    Stop,
    actionable,
    decide,
    initial_role,
    snapshot_node,
    takeover_deadline_s,
)
from tandem.names import WARM as WARM_ROLE
from tandem.supervisor.health import BLOCKED, DEAD, FAILED, HEALTHY, MISSING, STALLED, STARTING, STOPPED, InstanceHealth

TTL = 3.0


def inst(node: str, state: str = HEALTHY, role: str | None = PASSIVE) -> InstanceHealth:
    return InstanceHealth(node, state, f"{node} is {state.lower()}", role, 0, None)


def view(*instances: InstanceHealth, holder: str | None = None, epoch: int = 1, valid: bool = True,
         expired_for_s: float | None = None, standby: str = HOT, drained: tuple[str, ...] = (),
         launches: dict[str, int] | None = None, nodes: tuple[str, ...] | None = None) -> InstanceView:
    nodes = nodes or tuple(i.node for i in instances)
    lease = None if holder is None and not valid else LeaseView(holder, epoch, valid,
                                                                 None if valid else (expired_for_s or 0.5))
    return InstanceView("trades", "shard-1", nodes, standby, TTL, {i.node: i for i in instances}, lease,
                     frozenset(drained), launches or {})


def test_initial_roles_follow_the_node_order():
    assert [initial_role(i) for i in range(4)] == [ACTIVE, PASSIVE, BACKUP, BACKUP]


def test_a_converged_instance_needs_nothing():
    world = view(inst("a", role=ACTIVE), inst("b", role=PASSIVE), inst("c", role=BACKUP), holder="a")
    assert decide(world) == []


def test_bootstrap_starts_the_first_node_as_active_then_the_standbys_in_order():
    empty = view(inst("a", MISSING, None), inst("b", MISSING, None), inst("c", MISSING, None), holder=None,
                 valid=False)
    assert decide(empty) == [Launch("a", ACTIVE, "no node runs the instance")]
    active_up = view(inst("a", role=ACTIVE), inst("b", MISSING, None), inst("c", MISSING, None), holder="a")
    actions = decide(active_up)
    assert [(a.node, a.role, a.resync_from) for a in actions] == [("b", PASSIVE, "a"), ("c", BACKUP, "a")]


def test_hot_active_dead_waits_for_the_passive_to_take_over_by_itself():
    world = view(inst("a", DEAD, ACTIVE), inst("b", role=PASSIVE), holder="a", valid=False, expired_for_s=1.0)
    actions = decide(world)
    assert isinstance(actions[0], Stop) and actions[0].node == "a" and actions[0].timeout_s <= 5
    assert isinstance(actions[1], AwaitPromotion) and actions[1].previous_holder == "a"
    assert actions[1].timeout_s == takeover_deadline_s(TTL)
    assert len(actions) == 2


def test_hot_after_promotion_the_failed_node_rejoins_as_passive_after_resync_from_the_new_active():
    world = view(inst("a", STOPPED, ACTIVE), inst("b", role=ACTIVE), holder="b", epoch=2)
    [launch] = decide(world)
    assert launch == Launch("a", PASSIVE, "STOPPED: a is stopped", resync_from="b")


def test_hot_failed_passive_is_relaunched_as_passive_after_resync_and_the_active_is_left_alone():
    world = view(inst("a", role=ACTIVE), inst("b", FAILED, PASSIVE), holder="a")
    [launch] = decide(world)
    assert (launch.node, launch.role, launch.resync_from) == ("b", PASSIVE, "a")
    assert "FAILED" in launch.reason


def test_dead_passive_is_stopped_then_relaunched_in_one_round():
    world = view(inst("a", role=ACTIVE), inst("b", DEAD, PASSIVE), holder="a")
    actions = decide(world)
    assert [type(a) for a in actions] == [Stop, Launch]
    assert actions[1].resync_from == "a" and actions[1].role == PASSIVE


def test_stalled_active_is_stopped_gracefully_so_the_passive_takes_over():
    world = view(inst("a", STALLED, ACTIVE), inst("b", role=PASSIVE), holder="a")
    actions = decide(world)
    assert isinstance(actions[0], Stop) and actions[0].node == "a" and "STALLED" in actions[0].reason
    assert isinstance(actions[1], AwaitPromotion)


def test_with_a_live_passive_the_failed_node_comes_back_as_backup():
    world = view(inst("a", FAILED, ACTIVE), inst("b", role=ACTIVE), inst("c", role=PASSIVE), holder="b",
                 nodes=("a", "b", "c"))
    [launch] = decide(world)
    assert (launch.node, launch.role, launch.resync_from) == ("a", BACKUP, "b")


def test_when_the_passive_was_promoted_the_failed_node_takes_the_passive_place():
    # a (ACTIVE) died, b (PASSIVE) took over, c stays BACKUP: a rejoins as PASSIVE, c is not touched
    world = view(inst("a", STOPPED, ACTIVE), inst("b", role=ACTIVE), inst("c", role=BACKUP), holder="b")
    assert decide(world) == [Launch("a", PASSIVE, "STOPPED: a is stopped", resync_from="b")]


def test_backup_moves_up_when_no_passive_is_left_and_none_can_be_launched():
    world = view(inst("a", role=ACTIVE), inst("b", STOPPED, PASSIVE), inst("c", role=BACKUP), holder="a",
                 drained=("b",))
    actions = decide(world)
    assert [type(a) for a in actions] == [Stop, Launch]
    assert (actions[1].node, actions[1].role, actions[1].resync_from) == ("c", PASSIVE, None)


def test_backup_moves_up_when_the_passive_is_over_its_restart_budget():
    world = view(inst("a", role=ACTIVE), inst("b", FAILED, PASSIVE), inst("c", role=BACKUP), holder="a",
                 launches={"b": MAX_LAUNCHES})
    actions = decide(world)
    assert isinstance(actions[0], Blocked) and actions[0].node == "b"
    assert [(type(a), a.node) for a in actions[1:]] == [(Stop, "c"), (Launch, "c")]
    assert actions[2].role == PASSIVE


def test_a_starting_standby_is_not_launched_twice():
    world = view(inst("a", role=ACTIVE), inst("b", STARTING, PASSIVE), holder="a")
    assert decide(world) == []


def test_an_instance_launched_as_active_that_lost_the_race_counts_as_passive():
    world = view(inst("a", role=ACTIVE), inst("b", role=ACTIVE), inst("c", role=BACKUP), holder="a")
    assert decide(world) == []


def test_a_hot_standby_that_does_not_take_an_expired_lease_is_restarted_as_active():
    late = takeover_deadline_s(TTL) + 1
    world = view(inst("a", STOPPED, ACTIVE), inst("b", role=PASSIVE), holder="a", valid=False, expired_for_s=late)
    actions = decide(world)
    assert [(type(a), a.node) for a in actions] == [(Stop, "b"), (Launch, "b")]
    assert actions[1].role == ACTIVE and actions[1].resync_from is None


def test_hot_with_nobody_running_restarts_the_last_holder_from_its_own_checkpoint():
    world = view(inst("a", FAILED, PASSIVE), inst("b", FAILED, ACTIVE), holder="b", valid=False, expired_for_s=99)
    [launch] = decide(world)
    assert (launch.node, launch.role, launch.resync_from) == ("b", ACTIVE, None)


def test_warm_failover_starts_the_passive_node_from_a_cut_of_the_failed_active():
    world = view(inst("a", DEAD, ACTIVE), inst("b", STOPPED, PASSIVE), holder="a", valid=False, expired_for_s=0.2,
                 standby=WARM)
    actions = decide(world)
    assert isinstance(actions[0], Stop) and actions[0].node == "a"
    assert actions[1] == Launch("b", ACTIVE, "warm failover: a is DEAD", resync_from="a")
    assert len(actions) == 2


def test_cold_standbys_do_not_run():
    world = view(inst("a", STOPPED, PASSIVE), inst("b", role=ACTIVE), inst("c", MISSING, None), holder="b",
                 standby=COLD)
    assert decide(world) == []


def test_cold_failed_active_is_not_relaunched_once_the_passive_node_is_active():
    world = view(inst("a", FAILED, ACTIVE), inst("b", role=ACTIVE), holder="b", epoch=2, standby=COLD)
    assert decide(world) == []


def test_cold_failover_starts_the_next_node_from_a_cut_of_the_failed_active():
    world = view(inst("a", DEAD, ACTIVE), inst("b", STOPPED, PASSIVE), holder="a", valid=False, standby=COLD)
    assert decide(world)[1] == Launch("b", ACTIVE, "warm failover: a is DEAD", resync_from="a")


def test_warm_mode_keeps_one_warm_standby_on_the_node_after_the_active():
    world = view(inst("a", STOPPED, PASSIVE), inst("b", role=ACTIVE), inst("c", MISSING, None), holder="b",
                 standby=WARM)
    [launch] = decide(world)
    assert (launch.node, launch.role, launch.resync_from) == ("c", WARM_ROLE, None)  # it cuts when it takes over
    running = view(inst("a", STOPPED, PASSIVE), inst("b", role=ACTIVE), inst("c", role=WARM_ROLE), holder="b",
                   standby=WARM)
    assert decide(running) == []  # one warm standby is enough: a stays down


def test_warm_failed_active_comes_back_as_the_warm_standby():
    world = view(inst("a", FAILED, ACTIVE), inst("b", role=ACTIVE), holder="b", epoch=2, standby=WARM)
    [launch] = decide(world)
    assert (launch.node, launch.role) == ("a", WARM_ROLE)
    over = view(inst("a", FAILED, ACTIVE), inst("b", role=ACTIVE), holder="b", epoch=2, standby=WARM,
                launches={"a": MAX_LAUNCHES})
    [blocked] = decide(over)
    assert isinstance(blocked, Blocked) and blocked.node == "a"


def test_a_live_warm_standby_takes_the_lease_by_itself():
    world = view(inst("a", DEAD, ACTIVE), inst("b", role=WARM_ROLE), holder="a", valid=False, expired_for_s=0.2,
                 standby=WARM)
    stop, wait = decide(world)
    assert isinstance(stop, Stop) and stop.node == "a"
    assert isinstance(wait, AwaitPromotion) and wait.previous_holder == "a"


def test_a_warm_standby_that_does_not_take_the_lease_is_restarted_as_active_from_a_cut():
    world = view(inst("a", DEAD, ACTIVE), inst("b", role=WARM_ROLE), holder="a", valid=False,
                 expired_for_s=takeover_deadline_s(TTL) + 1, standby=WARM)
    actions = decide(world)
    assert actions[-2] == Stop("b", actions[-2].reason) and actions[-1].role == ACTIVE
    assert actions[-1].resync_from == "a"  # its own checkpoint is as old as its last run


def test_warm_failover_wraps_around_the_node_order():
    world = view(inst("a", STOPPED, PASSIVE), inst("b", STOPPED, PASSIVE), inst("c", FAILED, ACTIVE), holder="c",
                 valid=False, standby=WARM)
    [launch] = decide(world)
    assert (launch.node, launch.resync_from) == ("a", "c")


def test_warm_bootstrap_starts_only_the_first_node():
    world = view(inst("a", MISSING, None), inst("b", MISSING, None), holder=None, valid=False, standby=WARM)
    assert decide(world) == [Launch("a", ACTIVE, "no ACTIVE instance runs")]


def test_draining_the_hot_active_hands_over_to_the_passive_and_waits():
    world = view(inst("a", role=ACTIVE), inst("b", role=BACKUP), inst("c", role=PASSIVE), holder="a", epoch=7,
                 drained=("a",))
    actions = decide(world)
    assert actions[0] == HandOver("a", "c", 7, "a is drained")
    assert isinstance(actions[1], AwaitPromotion) and actions[1].previous_epoch == 7


def test_after_the_handover_the_drained_node_is_stopped_and_not_relaunched():
    world = view(inst("a", role=PASSIVE), inst("b", role=ACTIVE), holder="b", epoch=8, drained=("a",))
    assert decide(world) == [Stop("a", "node drained")]
    stopped = view(inst("a", STOPPED, PASSIVE), inst("b", role=ACTIVE), holder="b", epoch=8, drained=("a",))
    assert decide(stopped) == []


def test_draining_the_warm_active_stops_it_and_the_next_round_starts_the_plan_elsewhere():
    world = view(inst("a", role=ACTIVE), inst("b", STOPPED, PASSIVE), holder="a", standby=WARM, drained=("a",))
    [stop] = decide(world)
    assert isinstance(stop, Stop) and stop.node == "a"
    after = view(inst("a", STOPPED, ACTIVE), inst("b", STOPPED, PASSIVE), holder="a", valid=False, standby=WARM,
                 drained=("a",))
    [launch] = decide(after)
    assert (launch.node, launch.role, launch.resync_from) == ("b", ACTIVE, "a")


def test_hot_drained_last_holder_is_restarted_elsewhere_from_a_cut():
    world = view(inst("a", STOPPED, ACTIVE), inst("b", STOPPED, PASSIVE), holder="a", valid=False, drained=("a",))
    [launch] = decide(world)
    assert (launch.node, launch.role, launch.resync_from) == ("b", ACTIVE, "a")


def test_draining_the_only_node_is_blocked():
    world = view(inst("a", role=ACTIVE), holder="a", drained=("a",))
    [blocked] = decide(world)
    assert isinstance(blocked, Blocked) and "no other node" in blocked.reason
    assert not actionable([blocked])


def test_a_crash_looping_node_is_given_up_until_an_operator_restarts_it():
    world = view(inst("a", role=ACTIVE), inst("b", FAILED, PASSIVE), holder="a", launches={"b": MAX_LAUNCHES})
    [blocked] = decide(world)
    assert isinstance(blocked, Blocked) and blocked.node == "b" and "tandem_ops" in blocked.reason
    assert not actionable(decide(world))


def test_actionable():
    assert actionable([Stop("a", "x")]) and actionable([Launch("a", ACTIVE, "x")])
    assert not actionable([AwaitPromotion("a", 1, 5.0, "x")]) and not actionable([])


def test_the_snapshot_runs_on_a_live_standbys_host_passive_first():
    world = view(inst("a", role=ACTIVE), inst("b", role=BACKUP), inst("c", role=PASSIVE), holder="a")
    assert snapshot_node(world) == "c"
    assert snapshot_node(view(inst("a", role=ACTIVE), inst("b", role=BACKUP), inst("c", DEAD), holder="a")) == "b"


def test_the_snapshot_runs_on_the_active_host_when_no_standby_lives():
    assert snapshot_node(view(inst("a", role=ACTIVE), inst("b", DEAD), holder="a")) == "a"
    assert snapshot_node(view(inst("a", role=ACTIVE), inst("b", role=PASSIVE), holder="a", drained=("b",))) == "a"
    # a warm plan: the standby node does not run
    assert snapshot_node(view(inst("a", role=ACTIVE), inst("b", MISSING, None), holder="a", standby=WARM)) == "a"


def test_no_snapshot_host_without_a_valid_lease():
    assert snapshot_node(view(inst("a", DEAD, ACTIVE), inst("b"), holder="a", valid=False)) is None
    assert snapshot_node(view(inst("a", STOPPED, None), inst("b", STOPPED, None))) is None
    assert snapshot_node(view(inst("a"), holder="z", nodes=("a",))) is None


def blocked(node: str, recorded: bool) -> InstanceHealth:
    return InstanceHealth(node, BLOCKED, "failed 2 runs in a row at the same batch: x", ACTIVE,
                          0, "BLOCKED" if recorded else "FAILED")


def test_a_failure_repeated_at_the_same_batch_is_recorded_blocked_and_the_standby_takes_over():
    world = view(blocked("a", recorded=False), inst("b", role=PASSIVE), holder="a", valid=False)
    actions = decide(world)
    assert actions[0] == Block("a", "failed 2 runs in a row at the same batch: x") and actionable(actions)
    assert not any(isinstance(a, Launch) and a.node == "a" for a in actions), "a BLOCKED node is never relaunched"
    assert any(isinstance(a, AwaitPromotion) for a in actions), "the live standby takes the lease as after a crash"


def test_a_recorded_blocked_node_waits_for_an_operator_and_the_others_run_without_it():
    world = view(blocked("a", recorded=True), inst("b", role=ACTIVE), inst("c", MISSING, None), holder="b")
    actions = decide(world)
    assert [type(a) for a in actions] == [Blocked, Launch]
    assert "restart the node from tandem_ops" in actions[0].describe()
    assert (actions[1].node, actions[1].role, actions[1].resync_from) == ("c", PASSIVE, "b")


def test_when_every_node_is_blocked_nothing_is_launched_and_the_instance_says_why():
    world = view(blocked("a", recorded=True), blocked("b", recorded=True), holder=None, valid=False)
    actions = decide(world)
    assert all(isinstance(a, Blocked) for a in actions) and not actionable(actions)
    assert "each is BLOCKED or drained" in actions[-1].reason


def test_a_warm_standby_left_from_warm_mode_becomes_the_hot_passive_after_a_re_sync():
    world = view(inst("a", role=ACTIVE), inst("b", role=WARM_ROLE), holder="a", standby=HOT)
    stop, launch = decide(world)
    assert stop.node == "b" and (launch.node, launch.role, launch.resync_from) == ("b", PASSIVE, "a")
