"""GoodputK, on a fake clock: it climbs to the k of the most tokens per second, k = 0 where drafting
steps are slow whatever they commit, keeps refreshing its neighbours' figures, and re-probes less
often while plain decoding stays the best."""

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


def test_climbs_while_the_largest_k_probed_is_the_best_then_runs_it():
    # 8 rows; each draft token costs 0.02 s, and a step of k commits 8 * (1 + k / 2) tokens
    batch = FakeBatch({k: (0.1 + 0.02 * k, int(8 * (1 + k / 2))) for k in (0, 1, 2, 4, 6)})
    chooser = chooser_on(batch)
    batch.steps(chooser, 16)
    # the first drafting step of all (the draft reads the prompts) is not counted: k = 1 runs again
    assert batch.ran == [0, 1, 1, 0, 1, 0, 1] + [2] * 3 + [4] * 3 + [6] * 3
    batch.steps(chooser, 10)
    rates = {k: tokens / seconds for k, (seconds, tokens) in batch.costs.items()}
    assert chooser.best == max(rates, key=rates.get) == 6
    assert batch.ran[16:] == [6] * 10


def test_chooses_plain_decoding_where_drafting_steps_are_slow_and_tries_only_the_cheapest_draft():
    # acceptance is high (every draft kept) but a drafting step costs far more than it commits
    batch = FakeBatch({0: (0.1, 8), 1: (0.3, 16), 2: (0.45, 24), 4: (0.8, 40)})
    chooser = chooser_on(batch)
    batch.steps(chooser, 7 + 19)
    assert chooser.best == 0
    assert batch.ran == [0, 1, 1, 0, 1, 0, 1] + [0] * 19  # k = 2 and 4, dearer still, never ran


def test_reprobes_the_neighbours_and_follows_a_change():
    costs = {0: (0.1, 8), 2: (0.2, 12), 4: (0.3, 14)}
    batch = FakeBatch(costs)
    chooser = chooser_on(batch)
    batch.steps(chooser, 7 + 20)
    assert batch.ran[7:] == [0] * 20
    # drafting now pays (say the batch drained to fewer rows): the next probe sees it
    costs[2], costs[4] = (0.12, 24), (0.15, 40)
    # a drafting step after a run of plain ones also feeds the draft model what they committed:
    # it is not counted, and the same k runs again; k = 2 then wins, so its next neighbour is climbed to
    batch.steps(chooser, 2 + 3)
    assert batch.ran[27:] == [2, 2, 4, 4, 4]
    batch.steps(chooser, 80)
    assert chooser.best == 4 and batch.ran[-10:] == [4] * 10
    assert 0 not in batch.ran[27:]  # from k = 4 the re-probes try its one neighbour, k = 2
    assert 3 <= batch.ran[32:].count(2) <= 5  # one step every 20
    assert abs(chooser.rate(4) - 40 / 0.15) < 1e-6


def test_a_tie_goes_to_the_smaller_k_and_nothing_measured_means_the_smallest():
    batch = FakeBatch({0: (0.1, 8), 3: (0.2, 16)})
    chooser = chooser_on(batch)
    assert chooser.best == 0
    batch.steps(chooser, 6)
    assert chooser.best == 0


def test_while_plain_decoding_stays_best_the_reprobes_grow_apart():
    """Leaving plain decoding makes the draft read every token it missed: each re-probe that
    confirms k = 0 doubles the wait before the next (20, 40, 80 steps); each round is two steps of
    k = 2, as the first after plain steps is a catch-up and runs again."""
    batch = FakeBatch({0: (0.1, 8), 2: (0.3, 12)})
    chooser = chooser_on(batch)
    batch.steps(chooser, 7 + 20 + 2 + 40 + 2 + 80 + 2 + 100)
    assert [i for i, k in enumerate(batch.ran) if k == 2 and i >= 7] == [27, 28, 69, 70, 151, 152]
    assert chooser.interval == 160


def test_a_reprobe_that_finds_drafting_pays_again_resets_the_wait():
    costs = {0: (0.1, 8), 2: (0.3, 12)}
    batch = FakeBatch(costs)
    chooser = chooser_on(batch)
    batch.steps(chooser, 7 + 20 + 2 + 40)
    assert chooser.interval == 40
    costs[2] = (0.05, 40)
    batch.steps(chooser, 2 + 5)  # the re-probe round after 40 plain steps: k = 2 now wins
    assert chooser.best == 2 and chooser.interval == 20 and batch.ran[-5:] == [2] * 5
