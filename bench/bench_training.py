"""Training-loop costs of ``registry.make`` envs (issue 9's measures), as ratios measured side by side in one run.

1. Per-turn time inside TorchRL's ``LLMCollector`` with a zero-cost policy, over the tests' stand-in backend (steps
   cost nothing), against TorchRL's own ``ChatEnv`` plus a constant-reward transform driven by the same collector and
   policy; at ~20 and at ~400 messages. Targets: ours / ChatEnv <= 1.5, ours 400 / 20 <= 1.3 (flat).
2. Tokens mode against history mode at ~400 messages, per env turn (``step_and_maybe_reset``, what the collector
   calls), same stand-in backend and tokenizer. Target: tokens / history <= 1.2.
3. ``AsyncEnvPool`` of 1, 2 and 4 envs on the real local backend (a sandboxed bash per env), threading and
   multiprocessing, with TorchRL's defaults (``stack="dense"``), trivial commands (``echo hi``): turns/s of each, and
   each over the pool of one. Target: turns/s grow with envs up to the core count (pool of min(cores, 4) / pool of 1
   >= 1.5). The pools are stepped through their async API, the one ``LLMCollector`` drives a pool with (TorchRL
   0.14's synchronous ``step_and_maybe_reset()`` fails for children of batch size (1,), ``ChatEnv`` too).

The policy is a ``TensorDictModule`` that writes the same fenced command every turn. ``ChatEnv`` takes the
policy's whole conversation from ``("history", "full")``, as TorchRL's wrappers write it in history mode, so the
policy of measure 1 writes that too (``prompt.extend(response)``, the wrappers' own call) for both envs; a second
series of ours uses a policy that writes ``("text", "response")`` only. The time of a turn is split into the policy,
the env (``step_and_maybe_reset``) and the rest, which is the collector's own work (CPU times).

Reaching 400 messages through the collector would take minutes (TorchRL's collector deep-copies each turn's output,
the whole conversation included), so the conversations are grown outside it and the collector starts from there:
ours by stepping the env (untimed), ``ChatEnv`` by a reset whose query is our env's conversation of that length,
built with ``History.extend`` as the policy grows it (a turn of such a ``ChatEnv`` costs what one of a ``ChatEnv``
grown turn by turn does: 57 and 51 ms at ~100 messages when this was written). A ``ChatEnv`` turn adds one message
(the response), ours two (the response and the command's output). CPU time of this process is the headline (on a
shared machine wall time also counts waiting for a core); wall time is printed beside it. Measure 3 is wall time
only: the bash children work outside this process.

    python bench/bench_training.py [--quick] [--turns 8] [--short 20] [--long 400] [--envs 1 2 4] [--pool-steps 25]
        [--measures 1 2 3]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import tensordict  # noqa: E402
import torch  # noqa: E402
from standin import StandinBackend  # noqa: E402
from tensordict import TensorDict, TensorDictBase, lazy_stack  # noqa: E402
from tensordict.nn import TensorDictModuleBase  # noqa: E402
from torchrl.collectors.llm import LLMCollector  # noqa: E402
from torchrl.data import Composite, Unbounded  # noqa: E402
from torchrl.data.llm import History  # noqa: E402
from torchrl.envs import AsyncEnvPool, Compose, EnvBase, Transform, TransformedEnv  # noqa: E402
from torchrl.envs.llm import ChatEnv  # noqa: E402

from mlgym_registry import TaskSpec, registry  # noqa: E402
from mlgym_registry.testing.tiny_model import tiny_tokenizer  # noqa: E402

RESPONSE = "I run a trivial command.\n```\necho hi\n```\n"
"""The policy's answer every turn: a valid command, so no turn is a format error and no episode ends."""
OUTPUT = "hi\n"
"""What the stand-in backend prints for every command, as ``echo hi`` would."""
STANDIN = "bench_training_standin"
"""The name the stand-in backend is registered under for the duration of the run."""
TASK = "prisonersDilemma"
"""The real task of measure 3."""
QUICK = ["--turns", "3", "--long", "60", "--pool-steps", "4", "--tokens-turns", "6"]
"""``--quick``: the same measures, shorter (seconds, not minutes); a smoke run, not figures to quote."""


# -- policy, and TorchRL's ChatEnv made equivalent -----------------------------------------------------------------
class FixedResponse(TensorDictModuleBase):
    """A zero-cost policy: writes ``response`` at ``("text", "response")`` for every env of the batch.

    Args:
        response: the answer, the same every turn.
        history: also write ``("history", "response")`` and ``("history", "full")`` (the prompt extended with the
            response, by ``History.extend`` as TorchRL's wrappers do in history mode); ``ChatEnv`` needs them.
        tokenizer: also write ``("tokens", "response")``, ``response`` encoded once with it (tokens mode).

    ``seconds`` accumulates the CPU time spent in ``forward``.
    """

    def __init__(self, response: str = RESPONSE, *, history: bool = False, tokenizer: Any = None):
        super().__init__()
        self.response = response
        self.history = history
        self.in_keys = [("history", "prompt")] if history else []
        self.out_keys = [("text", "response")]
        if history:
            self.out_keys += [("history", "response"), ("history", "full")]
        self.tokens: torch.Tensor | None = None
        if tokenizer is not None:
            self.tokens = torch.as_tensor(tokenizer(response, add_special_tokens=False)["input_ids"], dtype=torch.long)
            self.out_keys.append(("tokens", "response"))
        self.message = History(role="assistant", content=response, batch_size=())
        self.seconds = 0.0

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Write the fixed response (and its history or tokens) into ``tensordict``."""
        started = time.process_time()
        size = tensordict.batch_size[0]
        tensordict.set(("text", "response"), [self.response] * size)
        if self.tokens is not None:
            tensordict.set(("tokens", "response"), self.tokens.expand(size, -1).clone())
        if self.history:
            prompt = tensordict.get(("history", "prompt"))
            response = lazy_stack([lazy_stack([self.message]) for _ in range(size)])
            tensordict.set(("history", "response"), response)
            tensordict.set(("history", "full"), prompt.extend(response, inplace=False, dim=-1))
        self.seconds += time.process_time() - started
        return tensordict


class ConstantReward(Transform):
    """The reward transform of the ``ChatEnv`` baseline: a constant reward of shape batch + (1, 1), as TorchRL's LLM
    reward transforms and our env write it."""

    def __init__(self, value: float = 0.0):
        super().__init__()
        self.value = value

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        next_tensordict.set("reward", torch.full((*next_tensordict.batch_size, 1, 1), self.value))
        return next_tensordict

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        return tensordict_reset

    def transform_reward_spec(self, reward_spec: Composite) -> Composite:
        """Declare the reward."""
        reward_spec["reward"] = Unbounded(shape=(*reward_spec.shape, 1, 1))
        return reward_spec


class SeedQuery(Transform):
    """Gives ``ChatEnv``'s reset its query: ``conversation``, a ``History`` of shape (1, n) that becomes the prompt.

    After the reset the query is replaced by a short string (our env's ``query`` is the task's name), so the
    conversation is not carried a second time through every turn.
    """

    def __init__(self, conversation: History, name: str = "benchTask"):
        super().__init__()
        self.conversation = conversation
        self.name = name

    def _reset_env_preprocess(self, tensordict: TensorDictBase | None) -> TensorDictBase:
        if tensordict is None:
            tensordict = TensorDict(batch_size=self.parent.batch_size)
        tensordict.set("query", self.conversation)
        return tensordict

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        tensordict_reset.set("query", [self.name] * tensordict_reset.batch_size[0])
        return tensordict_reset


def as_history(roles: list[str], contents: list[str]) -> History:
    """A conversation of shape (1, n), built with ``History.extend`` as the policy grows ``ChatEnv``'s prompts."""
    first = lazy_stack([History(role=roles[0], content=contents[0], batch_size=())]).unsqueeze(0)
    rest = lazy_stack([History(role=r, content=c, batch_size=()) for r, c in zip(roles[1:], contents[1:], strict=True)])
    return first.extend(rest.unsqueeze(0), inplace=False, dim=-1)


def chat_env(conversation: History) -> EnvBase:
    """TorchRL's ``ChatEnv`` (history mode, batch (1,)) whose resets start from ``conversation``, with a reward."""
    return TransformedEnv(ChatEnv(batch_size=(1,)), Compose(SeedQuery(conversation), ConstantReward()))


# -- timing ----------------------------------------------------------------------------------------------------------
@dataclass
class Turns:
    """Per-turn samples of one series, in milliseconds."""

    cpu: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)
    env: list[float] = field(default_factory=list)
    policy: list[float] = field(default_factory=list)
    messages: list[int] = field(default_factory=list)

    def median(self, name: str) -> float:
        """The median of one sample list."""
        return statistics.median(getattr(self, name))


def timed_env(env: EnvBase) -> EnvBase:
    """Wrap ``env.step_and_maybe_reset`` (what the collector calls) to accumulate its CPU time in ``env.seconds``."""
    step_and_maybe_reset = env.step_and_maybe_reset
    env.seconds = 0.0

    def wrapper(tensordict: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        started = time.process_time()
        try:
            return step_and_maybe_reset(tensordict)
        finally:
            env.seconds += time.process_time() - started

    env.step_and_maybe_reset = wrapper
    return env


def messages_of(tensordict: TensorDictBase) -> int:
    """How many messages the conversation at ``("history", "prompt")`` holds."""
    return tensordict.get(("history", "prompt")).batch_size[-1]


def advance(env: EnvBase, policy: Callable, tensordict: TensorDictBase, messages: int) -> TensorDictBase:
    """Step ``env`` (untimed, outside any collector) until its conversation holds at least ``messages`` messages."""
    while messages_of(tensordict) < messages:
        _, tensordict = env.step_and_maybe_reset(policy(tensordict))
    return tensordict


class Series:
    """One env in an ``LLMCollector``, timed turn by turn, kept near ``messages`` messages by ``start``.

    ``start`` returns the tensordict the collector continues from: the env's output at that length.
    """

    def __init__(self, name: str, env: EnvBase, policy: FixedResponse, start: Callable[[EnvBase], TensorDictBase],
                 messages: int, slack: int):
        self.name, self.env, self.policy, self.start = name, timed_env(env), policy, start
        self.messages, self.slack = messages, slack
        self.collector = LLMCollector(self.env, policy=policy, dialog_turns_per_batch=1)
        self.turns = Turns()
        self._iterator: Iterator | None = None
        self._restart()

    def _restart(self) -> None:
        # LLMCollector keeps the env's latest output in ``_shuttle`` and resets the env only while it is None:
        # starting it from a conversation grown outside it saves minutes of untimed turns through the collector
        if not hasattr(self.collector, "_shuttle"):
            raise RuntimeError("this TorchRL's LLMCollector has no _shuttle to start mid-conversation from")
        self.collector._shuttle = self.start(self.env)
        if self._iterator is None:
            self._iterator = iter(self.collector)

    def turn(self) -> None:
        """Time one turn of the collector (one ``next`` of its iterator: policy, env, bookkeeping)."""
        if messages_of(self.collector._shuttle) > self.messages + self.slack:
            self._restart()
        self.turns.messages.append(messages_of(self.collector._shuttle))
        env_before, policy_before = self.env.seconds, self.policy.seconds
        cpu, wall = time.process_time(), time.perf_counter()
        batch = next(self._iterator)
        self.turns.cpu.append((time.process_time() - cpu) * 1e3)
        self.turns.wall.append((time.perf_counter() - wall) * 1e3)
        self.turns.env.append((self.env.seconds - env_before) * 1e3)
        self.turns.policy.append((self.policy.seconds - policy_before) * 1e3)
        if batch["next", "done"].any():
            raise RuntimeError(f"{self.name}: the episode ended during the benchmark; it should run on")

    def close(self) -> None:
        """Shut the collector down and close the env."""
        self.collector.shutdown()
        self.env.close()


def standin_spec() -> TaskSpec:
    """The benchmark task the stand-in backend plays."""
    return TaskSpec(id="benchTask", description="A benchmark task.", baseline_scores=[{"Score": 1.0}], max_steps=10**6)


def make_ours(**options: Any) -> EnvBase:
    """Our env over the stand-in backend, set to run on: no step limit, no turn cap, with the reward to train on."""
    options = {"reward": "mlgym_best_improvement", **options}
    return registry.make(standin_spec(), backend=STANDIN, max_steps=10**6, max_turns=None, **options)


def verdict(met: bool) -> str:
    """How a target line ends."""
    return "met" if met else "NOT met"


# -- measure 1 -------------------------------------------------------------------------------------------------------
def measure_collector(short: int, long: int, turns: int) -> dict[str, float]:
    """Per-turn time in ``LLMCollector``: ours and ChatEnv at ``short`` and ``long`` messages, alternated."""
    text_policy = FixedResponse()
    # our env's conversation at ``long`` messages and beyond: ChatEnv's resets start from (prefixes of) it
    probe = make_ours()
    td = advance(probe, text_policy, probe.reset(), long + 1)
    prompt = td.get(("history", "prompt"))[0]
    roles, contents = list(prompt.role), list(prompt.content)
    probe.close()
    conversations = {length: as_history(roles[:length], contents[:length]) for length in (short, long)}

    history_policy = FixedResponse(history=True)

    def ours_at(length: int, policy: FixedResponse) -> Callable[[EnvBase], TensorDictBase]:
        return lambda env: advance(env, policy, env.reset(), length)

    def chat_at(length: int) -> Callable[[EnvBase], TensorDictBase]:
        def start(env: EnvBase) -> TensorDictBase:
            # two untimed turns, so the prompt is one the policy's History.extend built, as on every later turn
            return advance(env, history_policy, env.reset(), length + 2)
        return start

    series = []
    try:
        for length in (short, long):
            slack = 6 if length == short else 10**9
            series.append(Series(f"ours@{length}", make_ours(), FixedResponse(history=True),
                                 ours_at(length, text_policy), length, slack))
            series.append(Series(f"chat@{length}", chat_env(conversations[length]), FixedResponse(history=True),
                                 chat_at(length), length + 2, slack))
            series.append(Series(f"ours-text@{length}", make_ours(), FixedResponse(), ours_at(length, text_policy),
                                 length, slack))
        for _ in range(turns):
            for one in series:
                one.turn()
    finally:
        for one in series:
            one.close()
    by_name = {one.name: one.turns for one in series}
    print(f"1. per turn inside LLMCollector, stand-in backend, zero-cost policy; median of {turns} alternated turns")
    print("   series: ours and ChatEnv(+constant reward) with a policy that writes ('text','response') and "
          "('history','full'); ours-text with one that writes ('text','response') only")
    print(f"   {'series':<16}{'messages':>10}{'CPU ms':>10}{'wall ms':>10}   CPU ms of which: {'policy':>8}{'env':>10}"
          f"{'collector':>11}")
    for name, samples in by_name.items():
        cpu, env, policy = samples.median("cpu"), samples.median("env"), samples.median("policy")
        print(f"   {name:<16}{samples.median('messages'):>10.0f}{cpu:>10.2f}{samples.median('wall'):>10.2f}"
              f"{'':>20}{policy:>8.2f}{env:>10.2f}{max(cpu - env - policy, 0.0):>11.2f}")
    result = {}
    for length in (short, long):
        ours, chat = by_name[f"ours@{length}"], by_name[f"chat@{length}"]
        result[f"vs_chat_{length}"] = ours.median("cpu") / chat.median("cpu")
        result[f"env_vs_chat_{length}"] = ours.median("env") / chat.median("env")
    for name in ("ours", "chat", "ours-text"):
        result[f"flat_{name}"] = by_name[f"{name}@{long}"].median("cpu") / by_name[f"{name}@{short}"].median("cpu")
        result[f"env_flat_{name}"] = by_name[f"{name}@{long}"].median("env") / by_name[f"{name}@{short}"].median("env")
    for length in (short, long):
        ratio = result[f"vs_chat_{length}"]
        print(f"   ratio ours/ChatEnv per turn at ~{length} messages: {ratio:.2f} (env part alone: "
              f"{result[f'env_vs_chat_{length}']:.2f}); target <= 1.5: {verdict(ratio <= 1.5)}")
    for name in ("ours", "ours-text", "chat"):
        ratio = result[f"flat_{name}"]
        target = f"target <= 1.3: {verdict(ratio <= 1.3)}" if name != "chat" else "(ChatEnv, for reference)"
        print(f"   ratio {long}/{short} messages per turn, {name}: {ratio:.2f} (env part alone: "
              f"{result[f'env_flat_{name}']:.2f}); {target}")
    return result


# -- measure 2 -------------------------------------------------------------------------------------------------------
def measure_tokens(long: int, turns: int) -> float:
    """Per env turn at ``long`` messages, tokens mode over history mode (same tokenizer), alternated."""
    tokenizer = tiny_tokenizer()
    modes = {
        "history": (make_ours(input_mode="history", tokenizer=tokenizer), FixedResponse()),
        "tokens": (make_ours(input_mode="tokens", tokenizer=tokenizer), FixedResponse(tokenizer=tokenizer)),
    }
    samples: dict[str, Turns] = {mode: Turns() for mode in modes}
    try:
        outputs = {mode: advance(env, policy, env.reset(), long) for mode, (env, policy) in modes.items()}
        for _ in range(turns):
            for mode, (env, policy) in modes.items():
                tensordict = policy(outputs[mode])
                samples[mode].messages.append(messages_of(tensordict))
                cpu, wall = time.process_time(), time.perf_counter()
                _, outputs[mode] = env.step_and_maybe_reset(tensordict)
                samples[mode].cpu.append((time.process_time() - cpu) * 1e3)
                samples[mode].wall.append((time.perf_counter() - wall) * 1e3)
        if ("tokens", "prompt") not in outputs["tokens"].keys(include_nested=True):
            raise RuntimeError("tokens mode wrote no ('tokens', 'prompt')")
    finally:
        for env, _ in modes.values():
            env.close()
    print(f"2. per env turn (step_and_maybe_reset) at ~{long} messages, stand-in backend, tiny tokenizer; median of "
          f"{turns} alternated turns")
    for mode, turn in samples.items():
        print(f"   {mode:<8} mode: {turn.median('cpu'):7.2f} ms CPU, {turn.median('wall'):7.2f} ms wall, "
              f"at {turn.median('messages'):.0f} messages")
    ratio = samples["tokens"].median("cpu") / samples["history"].median("cpu")
    wall = samples["tokens"].median("wall") / samples["history"].median("wall")
    print(f"   ratio tokens/history per turn: {ratio:.2f} (wall {wall:.2f}); target <= 1.2: {verdict(ratio <= 1.2)}")
    return ratio


# -- measure 3 -------------------------------------------------------------------------------------------------------
POOL_BACKENDS = ("threading", "multiprocessing")


def make_pool(backend: str, size: int) -> tuple[AsyncEnvPool, TensorDictBase]:
    """An ``AsyncEnvPool`` of ``size`` real envs with TorchRL's defaults (``stack="dense"``), and its first reset."""
    from mlgym_registry.scale.workers import warm_workers

    factory = functools.partial(registry.make, TASK, max_steps=10**6)
    with warm_workers(), warnings.catch_warnings():  # forked from a preloaded server: spawning costs seconds each
        warnings.simplefilter("ignore", FutureWarning)  # the multiprocessing pool's note on its future exchange
        pool = AsyncEnvPool([factory] * size, backend=backend)
    return pool, pool.reset()


def pool_round(pool: AsyncEnvPool, tensordict: TensorDictBase) -> TensorDictBase:
    """One turn of every env of ``pool`` through its async API (the one ``LLMCollector`` drives a pool with)."""
    size = tensordict.batch_size[0]
    tensordict.set(("text", "response"), [[RESPONSE]] * size)
    pool.async_step_and_maybe_reset_send(tensordict)
    _, following = pool.async_step_and_maybe_reset_recv(min_get=size)
    return following


def measure_pool(sizes: list[int], steps: int) -> float:
    """Turns/s of ``AsyncEnvPool``s of ``sizes`` real envs, threading and multiprocessing, rounds interleaved.

    Returns the threading pool's turns/s at the largest size over one env's."""
    from mlgym_registry.machine import usable_cores

    cores = usable_cores()
    settings = [(backend, size) for backend in POOL_BACKENDS for size in sizes]
    pools: dict[tuple[str, int], AsyncEnvPool] = {}
    states: dict[tuple[str, int], TensorDictBase] = {}
    wall = dict.fromkeys(settings, 0.0)
    try:
        for setting in settings:
            pools[setting], states[setting] = make_pool(*setting)
        for round_number in range(steps + 2):  # two warm-up rounds
            for setting in settings:
                started = time.perf_counter()
                states[setting] = pool_round(pools[setting], states[setting])
                if round_number >= 2:
                    wall[setting] += time.perf_counter() - started
    finally:
        for pool in pools.values():
            pool.close()
    rates = {setting: steps * setting[1] / wall[setting] for setting in settings}
    print(f"3. AsyncEnvPool with TorchRL's defaults (stack='dense'), real local backend ({TASK}), `echo hi` every "
          f"turn; {steps} interleaved rounds, wall time; {cores} cores here")
    top = max(sizes)
    at_cores = max(size for size in sizes if size <= max(cores, min(sizes)))
    for backend in POOL_BACKENDS:
        one = rates[(backend, min(sizes))]
        cells = [f"{size} env{'s' if size > 1 else ''} {rates[(backend, size)]:.1f} turns/s "
                 f"({rates[(backend, size)] / one:.2f}x)" for size in sizes]
        print(f"   {backend}: " + ", ".join(cells))
        growth = rates[(backend, at_cores)] / one
        print(f"   ratio pool of {at_cores} / pool of {min(sizes)}, turns/s, {backend}: {growth:.2f} (pool of {top}: "
              f"{rates[(backend, top)] / one:.2f}); target >= 1.5 (grows up to the {cores} cores): "
              f"{verdict(growth >= 1.5)}")
    return rates[("threading", top)] / rates[("threading", min(sizes))]


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the measures; print each ratio with its target; return the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"a short smoke run: {' '.join(QUICK)}")
    parser.add_argument("--turns", type=int, default=8, help="turns timed per series in measure 1")
    parser.add_argument("--short", type=int, default=20, help="the short conversation, in messages")
    parser.add_argument("--long", type=int, default=400, help="the long conversation, in messages")
    parser.add_argument("--tokens-turns", type=int, default=30, help="turns timed per mode in measure 2")
    parser.add_argument("--envs", type=int, nargs="+", default=[1, 2, 4], help="pool sizes of measure 3")
    parser.add_argument("--pool-steps", type=int, default=25, help="rounds timed in measure 3")
    parser.add_argument("--measures", type=int, nargs="+", default=[1, 2, 3], choices=[1, 2, 3])
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if args.quick:  # the quick settings, then whatever the command line says
        args = parser.parse_args([*QUICK, *argv])
    tensordict.set_list_to_stack(True).set()
    started = time.perf_counter()
    ratios: dict[str, float] = {}
    with warnings.catch_warnings():
        # TorchRL's collectors warn about an InitTracker for every LLM env, ChatEnv included; nothing here reads one
        warnings.filterwarnings("ignore", message="The env passed to LLMCollector is missing")
        registry.register("backend", STANDIN, lambda spec, **kw: StandinBackend(spec, outputs=lambda action: OUTPUT))
        try:
            if 1 in args.measures:
                ratios.update(measure_collector(args.short, args.long, args.turns))
            if 2 in args.measures:
                ratios["tokens_vs_history"] = measure_tokens(args.long, args.tokens_turns)
        finally:
            registry.unregister("backend", STANDIN)
        if 3 in args.measures:
            ratios["pool_vs_one"] = measure_pool(sorted(set(args.envs)), args.pool_steps)
    print(f"done in {time.perf_counter() - started:.0f} s")
    return ratios


if __name__ == "__main__":
    main()
