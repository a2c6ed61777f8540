"""GoodputK, on a fake clock: it climbs to the k of the most tokens per second, k = 0 where drafting
steps are slow whatever they commit; it compares ks only within a round of interleaved steps,
changes k only for a clear gain, waits before the next round as long as the last one cost, and
counts no step the decoder marks as unmeasured."""

from __future__ import annotations

from specdec_cli.decoding.batch_k import GoodputK

FIRST_ROUND = [0, 1, 1, 0, 1, 0, 1]  # 0 against 1; the first drafting step of all is not counted and runs again


class FakeBatch:
    """Steps whose seconds and committed tokens depend only on k: {k: (seconds, tokens)}."""

    def __init__(self, costs: dict[int, tuple[float, int]]):
        self.costs = costs
        self.now = 0.0
        self.ran: list[int] = []

    def clock(self) -> float:
        return self.now

    def steps(self, chooser: GoodputK, n: int, measured: bool = True) -> None:
        for _ in range(n):
            k = chooser.next_k(measured)
            seconds, tokens = self.costs[k]
            self.now += seconds
            self.ran.append(k)
            chooser.record(tokens)


def chooser_on(batch: FakeBatch, **options) -> GoodputK:
    return GoodputK(sorted(batch.costs), clock=batch.clock, probe_steps=3, reprobe_every=20, **options)


def test_climbs_while_the_larger_neighbour_wins_then_runs_the_best():
    # 8 rows; each draft token costs 0.02 s, and a step of k commits 8 * (1 + k / 2) tokens:
    # 80, 100, 114, 133, 145 tokens/s at k = 0, 1, 2, 4, 6
    batch = FakeBatch({k: (0.1 + 0.02 * k, int(8 * (1 + k / 2))) for k in (0, 1, 2, 4, 6)})
    chooser = chooser_on(batch)
    batch.steps(chooser, 7 + 3 * 6)
    # each round: the k in use and its challenger, interleaved
    assert batch.ran == FIRST_ROUND + [1, 2] * 3 + [2, 4] * 3 + [4, 6] * 3
    batch.steps(chooser, 10)
    assert chooser.current == 6 and batch.ran[-10:] == [6] * 10


def test_chooses_plain_decoding_where_drafting_steps_are_slow_and_tries_only_the_cheapest_draft():
    # acceptance is high (every draft kept) but a drafting step costs far more than it commits
    batch = FakeBatch({0: (0.1, 8), 1: (0.3, 16), 2: (0.45, 24), 4: (0.8, 40)})
    chooser = chooser_on(batch)
    batch.steps(chooser, 7 + 19)
    assert chooser.current == 0
    assert batch.ran == FIRST_ROUND + [0] * 19  # k = 2 and 4, dearer still, never ran


def test_drafting_is_charged_what_it_costs_outside_its_steps():
    """k = 1's steps are 11% faster than plain's, but the draft's reads of joining rows' prompts cost
    2 ms a committed token (the decoder's overhead): plain decoding stays; without that charge k = 1
    would take over (test above)."""
    for overhead, chosen in ((0.0, 1), (0.002, 0)):
        batch = FakeBatch({0: (0.1, 8), 1: (0.09, 8)})
        chooser = chooser_on(batch, overhead=lambda o=overhead: o)
        batch.steps(chooser, 7)
        assert chooser.current == chosen, overhead


def test_seconds_the_overhead_already_charges_are_not_counted_twice():
    """A step that read a joined row's prompt reports those seconds as excluded: its figure is the
    step's own. Counted, one such read in a round would make k = 1 lose."""
    batch = FakeBatch({0: (0.1, 8), 1: (0.09, 8)})
    chooser = chooser_on(batch)
    for step in range(7):
        k = chooser.next_k()
        seconds, tokens = batch.costs[k]
        read = 0.5 if (k == 1 and step == 4) else 0.0  # a row joined: the draft read its prompt
        batch.now += seconds + read
        chooser.record(tokens, excluded=read)
    assert chooser.current == 1


def test_a_challenger_takes_over_only_by_a_clear_margin():
    slightly = FakeBatch({0: (0.1, 8), 1: (0.097, 8)})  # 3% more tokens a second
    clearly = FakeBatch({0: (0.1, 8), 1: (0.09, 8)})  # 11% more
    for batch in (slightly, clearly):
        batch.steps(chooser := chooser_on(batch), 7 + 5)
        assert chooser.current == (0 if batch is slightly else 1)
        assert batch.ran[7:] == [chooser.current] * 5


def test_figures_from_another_moment_of_the_run_are_not_compared():
    """Between rounds every k slows alike (the batch's rows grew longer): plain decoding's fresh
    figure is below the drafting step's old one, and still k stays until a round measures both."""
    costs = {0: (0.1, 8), 1: (0.2, 12)}  # 80 against 60 tokens/s
    batch = FakeBatch(costs)
    chooser = chooser_on(batch)
    batch.steps(chooser, 7)
    assert chooser.interval == 100  # what the round cost (below)
    costs[0], costs[1] = (0.2, 8), (0.4, 12)  # 40 against 30
    batch.steps(chooser, 99)
    assert batch.ran[7:] == [0] * 99
    batch.steps(chooser, 1 + 7)  # the next round, after 100 steps on k = 0, measures both afresh
    assert batch.ran[-7:] == FIRST_ROUND and chooser.current == 0


def test_follows_a_change_at_the_next_round_and_keeps_reprobing_the_neighbours():
    costs = {0: (0.1, 8), 2: (0.2, 12), 4: (0.3, 14)}
    batch = FakeBatch(costs)
    chooser = chooser_on(batch)
    batch.steps(chooser, 7)
    # the first round's k = 2 steps took 0.8 s for 48 tokens, which plain decoding makes in 0.6 s:
    # 0.2 s is 2% of 100 plain steps
    assert chooser.interval == 100
    batch.steps(chooser, 100)
    assert batch.ran[7:] == [0] * 100
    # drafting now pays (say the batch's prompts changed): the next round sees it
    costs[2], costs[4] = (0.12, 24), (0.15, 40)  # 200 and 267 tokens/s against 80
    # a drafting step after a run of plain ones also feeds the draft model what they committed:
    # it is not counted, and the same k runs again; k = 2 then wins, so its untried neighbour is climbed to
    batch.steps(chooser, 7 + 6)
    assert batch.ran[107:] == [0, 2, 2, 0, 2, 0, 2] + [2, 4] * 3
    assert chooser.current == 4 and chooser.interval == 12  # a new k: the round that checks it soon
    batch.steps(chooser, 12 + 6)
    assert batch.ran[-6:] == [4, 2] * 3  # from k = 4 the rounds try its one neighbour, k = 2
    # 3 steps of k = 2 took 0.36 s for 72 tokens, 0.27 s at k = 4's rate: 0.09 s, 2% of 30 steps
    assert chooser.current == 4 and chooser.interval == 30
    assert abs(chooser.rate(4) - 40 / 0.15) < 1e-6


def test_a_switch_is_checked_again_soon():
    """The first round's drafting steps kept every draft (rows had just begun their answers) and
    beat plain decoding; then drafting slows. The round that checks the switch comes RECHECK_EVERY
    steps later, not after a full wait, and goes back."""
    costs = {0: (0.1, 8), 1: (0.09, 8)}
    batch = FakeBatch(costs)
    chooser = chooser_on(batch, recheck_every=12)
    batch.steps(chooser, 7)
    assert chooser.current == 1 and chooser.interval == 12
    costs[1] = (0.12, 8)
    batch.steps(chooser, 12 + 6 + 4)
    assert batch.ran[7:] == [1] * 12 + [1, 0] * 3 + [0] * 4 and chooser.current == 0
    # the same after a climb: the switch to k = 1, then a round against k = 2 that keeps 1
    costs = {0: (0.1, 8), 1: (0.09, 8), 2: (0.2, 10)}
    batch = FakeBatch(costs)
    chooser = chooser_on(batch, recheck_every=12)
    batch.steps(chooser, 7 + 6)
    assert batch.ran[7:] == [1, 2] * 3 and chooser.current == 1 and chooser.interval == 12


def test_a_tie_keeps_the_k_in_use():
    batch = FakeBatch({0: (0.1, 8), 3: (0.2, 16)})
    chooser = chooser_on(batch)
    assert chooser.current == 0
    batch.steps(chooser, 7 + 3)
    assert chooser.current == 0 and batch.ran[7:] == [0] * 3


def test_the_wait_for_the_next_round_grows_with_what_a_round_costs():
    """Where the k in use stays, the next round comes when this one's cost (its challengers'
    seconds beyond what the k in use takes for their tokens) is PROBE_SHARE (2%) of the steps
    between: far off where a round pulls a plain batch's draft up to date, soon where it is cheap."""
    dear = FakeBatch({0: (0.1, 8), 2: (0.3, 12)})
    chooser = chooser_on(dear)
    dear.steps(chooser, 7 + 300 + 7)
    # 4 steps of k = 2 (the first a switch): 1.2 s for 48 tokens, 0.6 s at k = 0's 80 tokens/s
    assert chooser.interval == 300
    assert [i for i, k in enumerate(dear.ran) if k == 2] == [1, 2, 4, 6] + [308, 309, 311, 313]
    cheap = FakeBatch({0: (0.1, 8), 1: (0.1, 8)})  # as fast as plain decoding, not faster
    chooser = chooser_on(cheap)
    cheap.steps(chooser, 7)
    assert chooser.current == 0 and chooser.interval == 20


def test_a_round_that_finds_drafting_pays_again_shortens_the_wait():
    costs = {0: (0.1, 8), 2: (0.3, 12)}
    batch = FakeBatch(costs)
    chooser = chooser_on(batch)
    batch.steps(chooser, 7 + 300)
    costs[2] = (0.05, 40)
    batch.steps(chooser, 7 + 5)  # the round after 300 plain steps: k = 2 now wins
    assert chooser.current == 2 and chooser.interval == 12 and batch.ran[-5:] == [2] * 5


def test_unmeasured_steps_run_the_k_in_use_and_leave_the_round_where_it_is():
    batch = FakeBatch({0: (0.1, 8), 1: (0.05, 8)})
    chooser = chooser_on(batch)
    batch.steps(chooser, 3)  # 0, then 1 twice (the first drafting step is not counted)
    batch.steps(chooser, 5, measured=False)  # a drained batch: no probe runs, nothing counts
    assert batch.ran == [0, 1, 1] + [0] * 5 and chooser.current == 0
    batch.steps(chooser, 5 + 3)  # the round's 4 steps left; its first k = 1 reads what the 5 committed
    assert batch.ran[8:13] == [0, 1, 1, 0, 1] and chooser.current == 1 and batch.ran[13:] == [1] * 3
