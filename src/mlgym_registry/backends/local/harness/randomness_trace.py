"""Where a traced evaluation's randomness comes from (standard library only; loaded by ``harness.py`` beside it).

For ``mlgym-registry check --integrity``: the audit asks whether an evaluator's randomness follows the evaluation's
seed (the same seed, the same draws; another seed, other draws). Python's audit hooks say nothing of randomness, so
while a traced evaluation runs this module wraps the calls that decide it and keeps, in order and once each:

- ``seed``: a seed the evaluator's code gives a generator (``random.seed``, ``random.Random(x)``, numpy's ``seed`` and
  ``default_rng``, torch's ``manual_seed``), with its value and the line of the task's code that gave it;
- ``entropy``: fresh entropy taken from the system (``os.urandom``, ``os.getrandom``, and what ``secrets``,
  ``SystemRandom``, ``uuid4``, an unseeded ``random.Random()`` or an unseeded numpy generator take), with that line;
- ``seeded``: a global generator the harness seeded from the evaluation's seed (``random``, numpy's legacy one) that
  the evaluation drew from.

Each entry is one line, ``kind|source|where|value``: ``where`` is ``path:line`` of the innermost frame in the
evaluation's own files (the workspace), followed by `` via module`` when a library made the call for it; ``value``
is the seed's ``repr`` (at most 80 characters), empty for the others.
"""

from __future__ import annotations

import os
import sys

MAX = 200
"""The most entries kept."""
VALUE = 80
"""The most characters of a seed's repr kept."""


class RandomnessTrace:
    """Wraps the seeding and entropy calls of this process (``install``) and reports them (``report``)."""

    def __init__(self, workspace: str):
        self.workspace = os.path.join(os.path.abspath(workspace), "")
        self.here = os.path.dirname(os.path.abspath(__file__))
        self.kept: dict[str, None] = {}
        self.globals: dict[str, object] = {}
        """Per global generator the harness seeded: its state once seeded, to tell at the end whether it was used."""

    def install(self, after_import) -> None:
        """Wrap ``os``'s and ``random``'s calls now, numpy's and torch's now or as they are imported
        (``after_import(name, then)``: the harness's finder that calls ``then(module)`` once it is imported)."""
        import random

        self._entropy(os, "urandom", "os.urandom")
        if hasattr(os, "getrandom"):
            self._entropy(os, "getrandom", "os.getrandom")
        self._entropy(random, "_urandom", "os.urandom")  # SystemRandom, secrets, numpy's SeedSequence()
        original = random.Random.seed
        trace = self

        def seed(generator, a=None, *args, **kwargs):
            if a is None:
                trace.note("entropy", "random.Random() unseeded" if generator is not random._inst else "random.seed()")
            else:
                trace.note("seed", "random.seed" if generator is random._inst else "random.Random", a)
            return original(generator, a, *args, **kwargs)

        random.Random.seed = seed
        random.seed = random._inst.seed
        self.globals["random"] = random.getstate()
        for name, wrap in (("numpy", self._numpy), ("torch", self._torch)):
            if name in sys.modules:
                wrap(sys.modules[name])
            else:
                sys.meta_path.insert(0, after_import(name, wrap))

    def _entropy(self, module, name: str, source: str) -> None:
        original = getattr(module, name, None)
        if original is None:
            return
        trace = self

        def draw(*args, **kwargs):
            trace.note("entropy", source)
            return original(*args, **kwargs)

        setattr(module, name, draw)

    def _numpy(self, numpy) -> None:
        legacy = getattr(numpy.random, "get_state", None)
        if legacy is not None:
            try:
                self.globals["numpy.random"] = legacy()[1].tobytes()
            except Exception:  # noqa: BLE001 - a numpy without its legacy generator
                pass
        self._seeding(numpy.random, "seed", "numpy.random.seed")
        self._seeding(numpy.random, "default_rng", "numpy.random.default_rng")

    def _torch(self, torch) -> None:
        self._seeding(torch, "manual_seed", "torch.manual_seed")
        original = getattr(torch, "seed", None)
        if original is not None:
            trace = self

            def seed(*args, **kwargs):
                trace.note("entropy", "torch.seed")
                return original(*args, **kwargs)

            torch.seed = seed

    def _seeding(self, module, name: str, source: str) -> None:
        original = getattr(module, name, None)
        if original is None:
            return
        trace = self

        def seeded(seed=None, *args, **kwargs):
            if seed is None:
                trace.note("entropy", f"{source}() unseeded")
            else:
                trace.note("seed", source, seed)
            return original(seed, *args, **kwargs)

        setattr(module, name, seeded)

    def note(self, kind: str, source: str, value=None) -> None:
        """Keep one entry, located at the evaluation's own line that led to it; none for the harness's own calls."""
        where = self._where(sys._getframe(2))
        if where is None or len(self.kept) >= MAX:
            return
        shown = "" if value is None else _shown(value)
        self.kept.setdefault(f"{kind}|{source}|{where}|{shown}", None)

    def _where(self, frame) -> str | None:
        library = outer = None  # the innermost library frame, and the outermost one so far
        while frame is not None:
            name = frame.f_code.co_filename
            if name.startswith("<frozen importlib"):  # a library drew it as it was imported
                return f"the import of {_imported(frame) or outer or 'a module'}"
            path = os.path.abspath(name) if not name.startswith("<") else name
            if path.startswith(self.workspace):
                where = f"{path[len(self.workspace):]}:{frame.f_lineno}"
                return where if library is None else f"{where} via {library}"
            if os.path.dirname(path) == self.here:
                return None  # the harness seeding the global generators, or its own machinery
            if not path.startswith("<"):
                outer = _module_of(path)
                library = library or outer
            frame = frame.f_back
        return f"library code ({library})" if library else "unknown"

    def report(self) -> list[str]:
        """The entries, then one ``seeded`` entry per global generator the evaluation drew from."""
        used = []
        import random

        if "random" in self.globals and random.getstate() != self.globals["random"]:
            used.append("seeded|random|global generator|")
        numpy = sys.modules.get("numpy")
        if numpy is not None and "numpy.random" in self.globals:
            try:
                if numpy.random.get_state()[1].tobytes() != self.globals["numpy.random"] or \
                        numpy.random.get_state()[2] != 624:
                    used.append("seeded|numpy.random|global generator|")
            except Exception:  # noqa: BLE001 - a numpy without its legacy generator
                pass
        return [*self.kept, *used]


def _imported(frame) -> str | None:
    """The module being imported, read from the import system's frames (their ``spec``), innermost first."""
    while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
        spec = frame.f_locals.get("spec")
        name = getattr(spec, "name", None)
        if isinstance(name, str):
            return name
        frame = frame.f_back
    return None


def _module_of(path: str) -> str:
    """The dotted name a library file is imported by, from its path (``numpy/random/__init__.py``: numpy.random)."""
    parts = os.path.splitext(path)[0].split(os.sep)
    for index in range(len(parts) - 1, -1, -1):
        if parts[index] in ("site-packages", "dist-packages") or parts[index].startswith("python3"):
            parts = parts[index + 1:]
            break
    else:
        parts = parts[-1:]
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) or "a module"


def _shown(value) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - an object whose repr raises
        text = f"<{type(value).__name__}>"
    return text[:VALUE].replace("|", "/").replace("\n", " ")
