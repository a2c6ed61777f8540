"""GoodputK, on a fake clock: it picks the k of the most tokens per second, k = 0 where drafting
steps are slow whatever they commit, and keeps refreshing the others' figures."""

from __future__ import annotations

from specdec_cli.decoding.batch_k import GoodputK


class FakeBatch:
    """Steps whose seconds and committed tokens depend only on k: {k: (seconds, tokens)}."""

    def __init__(self, costs: dict[int, tuple[float, int]]):
        self.costs = costs
        self.now = 0.0
        self.ran: list[int] = []

    def clock(self) -> float:
        return self.now

    def steps(self, chooser: GoodputK, n: int) -> None:
        for _ in range(n):
            k = chooser.next_k()
            seconds, tokens = self.costs[k]
            self.now += seconds
            self.ran.append(k)
            chooser.record(tokens)


def chooser_on(batch: FakeBatch, **options) -> GoodputK:
    return GoodputK(sorted(batch.costs), clock=batch.clock, probe_steps=3, reprobe_every=20, **options)


def test_explores_every_candidate_round_robin_then_runs_the_best():
    # 8 rows; each draft token costs 0.02 s, and a step of k commits 8 * (1 + k / 2) tokens
    batch = FakeBatch({k: (0.1 + 0.02 * k, int(8 * (1 + k / 2))) for k in (0, 1, 2, 4, 6)})
    chooser = chooser_on(batch)
    batch.steps(chooser, 15)
    assert batch.ran == [0, 1, 2, 4, 6] * 3
    batch.steps(chooser, 10)
    rates = {k: tokens / seconds for k, (seconds, tokens) in batch.costs.items()}
    assert chooser.best == max(rates, key=rates.get) == 6
    assert batch.ran[15:] == [6] * 10


def test_chooses_plain_decoding_where_drafting_steps_are_slow():
    # acceptance is high (every draft kept) but a drafting step costs far more than it commits
    batch = FakeBatch({0: (0.1, 8), 1: (0.3, 16), 2: (0.45, 24), 4: (0.8, 40)})
    chooser = chooser_on(batch)
    batch.steps(chooser, 12 + 19)
    assert chooser.best == 0
    assert batch.ran[12:] == [0] * 19


def test_reprobes_the_others_and_follows_a_change():
    costs = {0: (0.1, 8), 2: (0.2, 12), 4: (0.3, 14)}
    batch = FakeBatch(costs)
    chooser = chooser_on(batch)
    batch.steps(chooser, 9 + 20)
    assert batch.ran[9:] == [0] * 20
    # drafting now pays (say the batch drained to fewer rows): the next probes see it
    costs[2], costs[4] = (0.12, 24), (0.15, 40)
    batch.steps(chooser, 1)
    # a drafting step after a run of plain ones also feeds the draft model what they committed:
    # it is not counted, and the same k runs again
    batch.steps(chooser, 2)
    assert batch.ran[29:] == [2, 2, 4]
    # each figure is its last 3 steps: k = 4 wins once the re-probes (one step each, every 20)
    # have replaced its old ones
    batch.steps(chooser, 80)
    assert chooser.best == 4 and batch.ran[-10:] == [4] * 10
    assert 3 <= batch.ran[32:].count(0) <= 5  # the probes of k = 0, one every 20 steps
    assert abs(chooser.rate(4) - 40 / 0.15) < 1e-6


def test_a_tie_goes_to_the_smaller_k_and_nothing_measured_means_the_smallest():
    batch = FakeBatch({0: (0.1, 8), 3: (0.2, 16)})
    chooser = chooser_on(batch)
    assert chooser.best == 0
    batch.steps(chooser, 6)
    assert chooser.best == 0
