"""GRPO on an MLGym task with TorchRL's LLM stack, straight over ``registry.make(task)``.

    python examples/grpo.py --updates 2                           # a tiny random model built offline, on CPU
    python examples/grpo.py --task capitals --lr 3e-3 --max-new-tokens 16 --updates 120  # learns in minutes on CPU
    python examples/grpo.py --model ./checkpoint --device cuda    # a local save_pretrained() checkpoint (a GPU)
    python examples/grpo.py --model ./checkpoint --engine vllm    # vLLM generates, transformers trains (GPU)

``./checkpoint`` is any ``save_pretrained()`` folder of a causal LM and its tokenizer; to try the script without one,
``python -c "from mlgym_registry.testing.tiny_model import save_tiny_checkpoint; save_tiny_checkpoint('checkpoint')"``
saves the tiny random model, offline. On CPU the defaults are small (``--max-new-tokens 32 --max-turns 2``), so an
update takes seconds; on a GPU they are 256 tokens and the env's own turn cap.

The pipeline: ``LLMCollector`` plays whole episodes and writes them to a ``ReplayBuffer``, whose ``MCAdvantage``
transform holds them until ``--grpo-size`` episodes of the same task (same ``"query"``) are done and writes the group
with its group-relative advantages; then ``GRPOLoss`` takes one optimizer step on the group, and the buffer is emptied
for the next group. docs/training.md walks through it.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os

import torch
from torchrl.collectors.llm import LLMCollector
from torchrl.data import LazyStackStorage, ReplayBuffer, SamplerWithoutReplacement
from torchrl.modules.llm import TransformersWrapper
from torchrl.objectives.llm import GRPOLoss, MCAdvantage
from transformers import AutoModelForCausalLM, AutoTokenizer

from mlgym_registry import registry
from mlgym_registry.testing.tiny_model import tiny_model, tiny_tokenizer

CPU_DEFAULTS = {"max_new_tokens": 32, "max_turns": 2}
"""On CPU, what keeps one update of the defaults to seconds (a GPU gets 256 tokens and the env's turn cap)."""


def device_problem(device: str) -> str | None:
    """Why torch cannot use ``device`` here (a name it does not know, CUDA on a CPU-only build or with no GPU
    visible, a GPU index past the last one, MPS on a machine without it); None when it can."""
    try:
        chosen = torch.device(device)
    except (RuntimeError, ValueError):
        return f"--device {device}: not a device torch knows; use cpu, cuda, cuda:N or mps"
    if chosen.type == "cuda":
        if not torch.cuda.is_available():
            build = "this torch is a CPU-only build" if torch.version.cuda is None else "torch sees no CUDA GPU"
            return (f"--device {device}: {build}; use --device cpu (the default here), or install a CUDA build of "
                    "torch on a machine with a GPU")
        if chosen.index is not None and chosen.index >= torch.cuda.device_count():
            count = torch.cuda.device_count()
            return f"--device {device}: torch sees {count} GPU(s), cuda:0 to cuda:{count - 1}"
    if chosen.type == "mps" and not torch.backends.mps.is_available():
        return f"--device {device}: MPS is not available here; use --device cpu"
    return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; ``--engine vllm`` without a GPU or without vLLM is an error here, before anything runs."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", nargs="+", default=["prisonersDilemma"], help="one task, or several to sample from")
    parser.add_argument("--template", help="a registered prompt template (e.g. short); default: the task's")
    parser.add_argument("--model", metavar="DIR", help="a local checkpoint (save_pretrained); default: a tiny one")
    parser.add_argument("--updates", type=int, default=20, help="optimizer steps, one per group of episodes")
    parser.add_argument("--grpo-size", type=int, default=4, help="episodes per group (G)")
    parser.add_argument("--max-new-tokens", type=int, help="tokens the model may write per turn (default: 256 on a "
                        f"GPU, {CPU_DEFAULTS['max_new_tokens']} on CPU)")
    parser.add_argument("--max-turns", type=int, help="cap on an episode's turns (default: the env's on a GPU, "
                        f"{CPU_DEFAULTS['max_turns']} on CPU)")
    parser.add_argument("--batch-size", type=int, default=8, help="turns per forward pass (gradients accumulate)")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--engine", choices=["transformers", "vllm"], default="transformers", help="what generates")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", metavar="DIR", help="save the trained model and tokenizer here")
    args = parser.parse_args(argv)
    problem = device_problem(args.device)
    if problem:
        parser.error(problem)
    on_cpu = torch.device(args.device).type == "cpu"
    if args.max_new_tokens is None:
        args.max_new_tokens = CPU_DEFAULTS["max_new_tokens"] if on_cpu else 256
    if args.max_turns is None and on_cpu:
        args.max_turns = CPU_DEFAULTS["max_turns"]
    if args.engine == "vllm":
        if not torch.cuda.is_available():
            parser.error("--engine vllm needs a CUDA GPU, and torch sees none; use --engine transformers")
        if importlib.util.find_spec("vllm") is None:
            parser.error("--engine vllm needs the vllm package (pip install vllm)")
        if args.model is None:
            parser.error("--engine vllm needs --model DIR: vLLM loads its weights from a checkpoint folder")
    return args


def load(args: argparse.Namespace):
    """The model to train and its tokenizer: ``--model DIR``, read offline, or the tiny model."""
    if args.model is None:
        tokenizer = tiny_tokenizer()
        model = tiny_model(tokenizer, seed=args.seed)
    else:
        tokenizer = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(args.model, local_files_only=True)
    # GRPOLoss's importance weights assume the model scores tokens as it sampled them: keep it in eval mode
    return model.to(args.device).eval(), tokenizer


def make_generator(args: argparse.Namespace, model, tokenizer):
    """The policy that plays: the training model itself, or a vLLM engine loaded from the same checkpoint."""
    sampling = {"max_new_tokens": args.max_new_tokens, "do_sample": True}  # TorchRL maps these for both engines
    if args.engine == "transformers":
        return TransformersWrapper(model, tokenizer=tokenizer, input_mode="history", generate=True,
                                   generate_kwargs=sampling, device=args.device)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: push_weights reaches it
    import vllm
    from torchrl.modules.llm import vLLMWrapper

    llm = vllm.LLM(args.model, gpu_memory_utilization=0.5)
    return vLLMWrapper(llm, tokenizer=tokenizer, input_mode="history", generate=True, generate_kwargs=sampling)


def push_weights(generator, model) -> None:
    """After an update, give vLLM the new weights (a TransformersWrapper shares the model, so needs nothing)."""
    if isinstance(generator, TransformersWrapper):
        return
    engine_model = generator.model.llm_engine.model_executor.driver_worker.model_runner.model
    engine_model.load_weights(model.state_dict().items())
    generator.model.reset_prefix_cache()


def train_on_group(buffer, loss_fn, scorer, optimizer, params, batch_size: int) -> dict:
    """One optimizer step over the group in ``buffer``: every turn once, ``batch_size`` turns per forward pass."""
    optimizer.zero_grad()
    passes = math.ceil(len(buffer) / batch_size)
    total, episodes, returns, task = 0.0, 0, 0.0, ""
    for batch in buffer:
        task = batch[0]["query"]  # the group's key: every episode in it played this task
        # TorchRL's TransformersWrapper gives the log-probs of the generated response only (and vLLM's come from
        # another engine), while GRPOLoss reads the behaviour policy's at ("log_probs", "full"), over the sequence it
        # scores: compute them with the training wrapper, before the step, on the very tokens that were sampled.
        # A recipe over TorchRL's own ChatEnv needs this line too.
        with torch.no_grad():
            batch.update(scorer(batch.copy()), keys_to_update=[("log_probs", "full")])
        losses = loss_fn(batch)
        loss = (losses.loss_objective + losses.loss_entropy) / passes
        loss.backward()
        total += loss.item()
        episodes += int(batch["next", "done"].sum())
        returns += float(batch["next", "reward"].sum())
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    return {"task": task, "loss": round(total, 6), "episodes": episodes, "turns": len(buffer),
            "mean_return": round(returns / max(episodes, 1), 6)}


def main(argv: list[str] | None = None) -> list[dict]:
    """Train for ``--updates`` steps; returns each step's task, loss, episode and turn counts and mean return."""
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    model, tokenizer = load(args)
    generator = make_generator(args, model, tokenizer)

    # the reward to train on: it pays only improvements of the episode's best score, so validating is never worth
    # more than improving (mlgym_score_delta, the reference's reward, pays every validate)
    options = {"tokenizer": tokenizer, "reward": "mlgym_best_improvement"}
    options |= {"max_turns": args.max_turns} if args.max_turns else {}
    options |= {"template": args.template} if args.template else {}
    env = registry.make(args.task[0], **options) if len(args.task) == 1 else registry.make(tasks=args.task, **options)
    env.set_seed(args.seed)

    # episodes wait in MCAdvantage until G of one task are done; each episode's summed reward, normalised across its
    # group, is the advantage of every turn in it
    buffer = ReplayBuffer(
        storage=LazyStackStorage(100_000),
        sampler=SamplerWithoutReplacement(),
        batch_size=args.batch_size,
        transform=MCAdvantage(grpo_size=args.grpo_size, trajectory_return="sum"),
    )
    collector = LLMCollector(env, policy=generator, yield_completed_trajectories=True, replay_buffer=buffer)

    # the training view of the same model reads the sampled tokens back; "sft" masking (GRPOLoss's default) scores
    # each turn's own response, after ("tokens", "prompt")
    scorer = TransformersWrapper(model, tokenizer=tokenizer, input_mode="tokens", generate=False,
                                 return_log_probs=True, device=args.device)
    loss_fn = GRPOLoss(scorer)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr)

    history: list[dict] = []
    try:
        for _ in collector:  # one finished episode per iteration, already in the buffer (or held by MCAdvantage)
            if len(buffer) == 0:
                continue
            stats = train_on_group(buffer, loss_fn, scorer, optimizer, params, args.batch_size)
            buffer.empty()
            push_weights(generator, model)
            history.append(stats)
            print(f"update {len(history)}:", stats, flush=True)
            if len(history) == args.updates:
                break
    finally:
        collector.shutdown()  # closes the env too
    if args.save:
        model.save_pretrained(args.save)
        tokenizer.save_pretrained(args.save)
    return history


if __name__ == "__main__":
    main()
