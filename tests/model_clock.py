"""A clock for bench and tune-k tests that only the models' forwards move: timings without the machine."""

from __future__ import annotations


class ModelClock:
    """A clock that only the models move: a target forward of n tokens costs 1 + 0.05 (n - 1), a draft
    forward 0.25, and the target's first 1-token forward in the process (a first call: kernels
    chosen, buffers grown) 100 more. Every figure is then set by the forwards a run makes, never by
    how fast or busy this machine is. `stall_in` names a method whose first timed run (max_new_tokens
    `timed`) pays one 100-unit stall after its first token, as a busy machine's neighbour would."""

    TARGET_LAYERS = 4  # tests/conftest.py: the target has 4 layers, the stranger 2

    def __init__(self, timed: int, stall_in: str | None = None):
        self.now = 0.0
        self.first_call_paid = False
        self.timed, self.stall_in = timed, stall_in
        self.running: tuple[str, int] | None = None
        self.stalled_steps = 0  # 1-token target forwards of the stalled method's timed run so far

    def __call__(self) -> float:
        return self.now

    def forward_cost(self, layers: int, n: int) -> float:
        if layers != self.TARGET_LAYERS:
            return 0.25
        cost = 1.0 + 0.05 * (n - 1)
        if n == 1 and not self.first_call_paid:
            self.first_call_paid = True
            cost += 100.0
        if n == 1 and self.running == (self.stall_in, self.timed):
            self.stalled_steps += 1
            if self.stalled_steps == 3:  # the first step is the time to first token: a later one
                cost += 100.0
        return cost

    def install(self, monkeypatch) -> "ModelClock":
        import specdec_cli.bench.engine_methods as engine_methods
        from transformers.models.llama.modeling_llama import LlamaForCausalLM

        forward, run = LlamaForCausalLM.forward, engine_methods.EngineMethod.run
        clock = self

        def timed_forward(model, *args, **kwargs):
            out = forward(model, *args, **kwargs)
            ids = kwargs.get("input_ids", args[0] if args else None)
            clock.now += clock.forward_cost(model.config.num_hidden_layers, ids.shape[-1])
            return out

        def noted_run(method, ids, max_new_tokens, sampling, seed):
            clock.running = (method.name, max_new_tokens)
            try:
                return run(method, ids, max_new_tokens, sampling, seed)
            finally:
                clock.running = None

        monkeypatch.setattr(LlamaForCausalLM, "forward", timed_forward)
        monkeypatch.setattr(engine_methods.EngineMethod, "run", noted_run)
        monkeypatch.setattr(engine_methods, "synced_clock", lambda device: clock)
        return self
