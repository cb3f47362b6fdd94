"""Runs a task's evaluator with the agent's code kept in another process (standard library only).

Two roles, each started by the local backend inside its own sandbox:

``harness.py evaluate --workspace DIR --trusted PATHS --fds W,R -- SCRIPT ARGS...``
    Runs the pristine evaluation script as ``__main__``. Its top-level imports resolve as follows: a trusted name (an
    evaluation or protected file of the task, given by its path) loads that exact pristine file, from source; a name
    the workspace defines in any form (source, bytecode, package) and the standard library or site-packages do not is
    the *agent's* module, which never runs here: it is a proxy whose functions call the ``serve`` process over a
    pipe; any other name loads from the standard library and site-packages, never from the workspace (a ``random.py``
    of the agent's shadows nothing). Byte code is cached in a private folder only. So agent code can neither rebind
    the evaluator's objects, nor exit it early, nor print into its output, which is the score's channel.

``harness.py serve --workspace DIR``
    Imports the agent's modules and answers calls: requests arrive on stdin as length-prefixed pickles (they come from
    the trusted evaluator), answers leave on stdout as JSON lines. Whatever it answers is only ever data to the
    evaluator (decoded as JSON, tuples marked), never code.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import pickle
import random
import runpy
import struct
import sys
import tempfile
import types

MAX_LINE = 64 << 20
"""The longest answer the evaluator reads from the agent's process (bytes)."""


# -- the wire format: JSON with tuples marked, so that `history` arguments keep their type ------------------------
def encode(value):
    """``value`` as JSON-ready data; raises TypeError for what cannot cross (functions, objects, ...)."""
    if type(value) is list and all(type(v) is int for v in value):
        return value  # the common answer of a `map`: moves
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, tuple):
        return {"__tuple__": [encode(v) for v in value]}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            return {"__pairs__": [[encode(k), encode(v)] for k, v in value.items()]}
        return {k: encode(v) for k, v in value.items()}
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item) and getattr(value, "shape", None) == ():
        return encode(item())
    tolist = getattr(value, "tolist", None)  # numpy arrays
    if callable(tolist):
        return encode(tolist())
    raise TypeError(f"a value of type {type(value).__name__} cannot be passed between the evaluator and agent code")


def decode(data):
    """The inverse of ``encode``."""
    if isinstance(data, list):
        return [decode(v) for v in data]
    if isinstance(data, dict):
        if set(data) == {"__tuple__"}:
            return tuple(decode(v) for v in data["__tuple__"])
        if set(data) == {"__pairs__"}:
            return {_hashable(decode(k)): decode(v) for k, v in data["__pairs__"]}
        return {k: decode(v) for k, v in data.items()}
    return data


def _hashable(value):
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value


# -- evaluator side -----------------------------------------------------------------------------------------------
class AgentCodeError(RuntimeError):
    """The agent's code raised, or answered with something that is not a value."""


class AgentChannel:
    """The evaluator's end of the pipe to the ``serve`` process."""

    def __init__(self, write_fd: int, read_fd: int):
        self._out = os.fdopen(write_fd, "wb")
        self._in = os.fdopen(read_fd, "rb")
        self.failed = False
        """True once any answer was an error: the agent's code failed, even if the script caught it."""

    def ask(self, **request):
        """Send one request and return the decoded ``value`` of its answer (or raise ``AgentCodeError``)."""
        return self.send(**request)()

    def send(self, **request):
        """Send one request; a function that waits for its answer and returns its decoded ``value``.

        One request at a time: call that function before sending the next.
        """
        try:
            data = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
            self._out.write(struct.pack("!Q", len(data)) + data)
            self._out.flush()
        except (OSError, ValueError) as exc:
            self.failed = True
            raise AgentCodeError(f"the process running the agent's code is gone ({exc})") from None
        return self._answer

    def _answer(self):
        try:
            return self._read_answer()
        except AgentCodeError:
            self.failed = True
            raise

    def _read_answer(self):
        try:
            line = self._in.readline(MAX_LINE)
        except (OSError, ValueError) as exc:
            raise AgentCodeError(f"the process running the agent's code is gone ({exc})") from None
        if not line.endswith(b"\n"):
            raise AgentCodeError("the process running the agent's code ended (it exited or was killed)")
        try:
            answer = json.loads(line)
            if not isinstance(answer, dict):
                raise ValueError
        except ValueError:
            raise AgentCodeError("the agent's code answered with something that is not a value") from None
        if "error" in answer:
            raise AgentCodeError(str(answer["error"]))
        return decode(answer.get("value"))


class AgentFunction:
    """A function of the agent's, called in the agent's process. ``map`` calls it on many argument tuples at once."""

    def __init__(self, channel: AgentChannel, module: str, name: str):
        self._channel, self._module, self.__name__ = channel, module, name
        self.__qualname__ = name

    def __call__(self, *args, **kwargs):
        return self._channel.ask(op="call", module=self._module, name=self.__name__, args=args, kwargs=kwargs)

    def map(self, calls):
        """``[self(*args) for args in calls]`` in one round trip."""
        return self.map_later(calls)()

    def map_later(self, calls):
        """Start ``map(calls)`` in the agent's process; a function that waits for its results. The evaluator may
        compute meanwhile, but must collect the results before it asks the agent's code anything else."""
        calls = list(calls)
        wait = self._channel.send(op="map", module=self._module, name=self.__name__, calls=calls)

        def results():
            values = wait()
            if not isinstance(values, list) or len(values) != len(calls):
                self._channel.failed = True
                raise AgentCodeError(f"{self.__name__}.map answered with the wrong number of results")
            return values

        return results

    def __repr__(self) -> str:
        return f"<agent function {self._module}.{self.__name__}>"


class AgentModule(types.ModuleType):
    """A module of the agent's: attribute reads fetch values or function proxies from the agent's process."""

    def __init__(self, name: str, channel: AgentChannel):
        super().__init__(name)
        self.__dict__["_channel"] = channel

    def __getattr__(self, attribute: str):
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        kind = self._channel.ask(op="describe", module=self.__name__, name=attribute)
        if kind == "missing":
            raise AttributeError(f"the agent's module {self.__name__!r} has no attribute {attribute!r}")
        if kind == "callable":
            return AgentFunction(self._channel, self.__name__, attribute)
        if kind == "module":
            return importlib.import_module(f"{self.__name__}.{attribute}")
        return self._channel.ask(op="get", module=self.__name__, name=attribute)


class _AgentLoader(importlib.abc.Loader):
    def __init__(self, channel: AgentChannel):
        self.channel = channel

    def create_module(self, spec):
        module = AgentModule(spec.name, self.channel)
        module.__path__ = []  # a package as far as the import system cares: submodules are the agent's too
        return module

    def exec_module(self, module):
        self.channel.ask(op="import", module=module.__name__)


class EvaluationFinder(importlib.abc.MetaPathFinder):
    """Decides, for every import of the evaluator, between the pristine file, the agent's process and the system."""

    def __init__(self, workspace: str, trusted: list[str], channel: AgentChannel | None, system_path: list[str]):
        self.workspace, self.channel, self.system_path = workspace, channel, system_path
        self.trusted = {_module_name(path): path for path in trusted}

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.partition(".")[0]
        if top in self.trusted:
            if fullname != top:
                return None  # a submodule of a trusted package: its own __path__ points into the pristine copy
            return self._trusted_spec(top, self.trusted[top])
        if not self._in_workspace(top):
            return None
        system = importlib.machinery.PathFinder.find_spec(top, self.system_path)
        if system is not None:
            # the workspace shadows a real module: always the real one, whatever sys.path the evaluator built
            return importlib.machinery.PathFinder.find_spec(fullname, self.system_path if fullname == top else path)
        if self.channel is None:  # this task's evaluator loads the agent's code itself (models cross as objects)
            return importlib.machinery.PathFinder.find_spec(fullname, [self.workspace] if fullname == top else path)
        return importlib.machinery.ModuleSpec(fullname, _AgentLoader(self.channel), is_package=True)

    def _trusted_spec(self, name: str, relative: str):
        """The pristine file itself: never a package or bytecode of the same name that the agent put beside it."""
        path = os.path.join(self.workspace, relative)
        if relative.endswith(".py"):
            return importlib.util.spec_from_file_location(name, path)
        return importlib.util.spec_from_file_location(
            name, os.path.join(path, "__init__.py"), submodule_search_locations=[path]
        )

    def _in_workspace(self, name: str) -> bool:
        """Whether the workspace defines an importable ``name`` in any form (source, bytecode, extension, package)."""
        return importlib.machinery.PathFinder.find_spec(name, [self.workspace]) is not None


def _module_name(relative: str) -> str:
    return relative[:-3] if relative.endswith(".py") else relative.rstrip("/")


def evaluate(workspace: str, trusted: list[str], fds: str, argv: list[str], status_fd: int | None = None) -> None:
    """Run the evaluation script ``argv[0]`` as ``__main__`` with the import rules of ``EvaluationFinder``.

    When ``status_fd`` is given, one JSON line is written to it as the script ends, saying how (see ``run_status``):
    the backend tells the agent's failures from the infrastructure's by it, never by the script's output.
    """
    channel = None
    if fds.strip(","):
        write_fd, read_fd = (int(x) for x in fds.split(","))
        channel = AgentChannel(write_fd, read_fd)
    system_path = [p for p in sys.path if p and os.path.abspath(p) != os.path.abspath(workspace)]
    # byte code is read and written only in a private folder: a __pycache__ of the agent's never stands in for a
    # pristine source
    sys.pycache_prefix = tempfile.mkdtemp(prefix="pycache-")
    sys.meta_path.insert(0, EvaluationFinder(workspace, trusted, channel, system_path))
    sys.argv = list(argv)
    status = os.fdopen(status_fd, "w", encoding="utf-8") if status_fd is not None else None
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except BaseException as exc:
        _report(status, run_status(exc, channel))
        raise
    _report(status, {"status": "finished"})


def run_status(exc: BaseException, channel: AgentChannel | None) -> dict:
    """How an evaluation script that raised ``exc`` ended.

    ``finished`` (it exited with status 0), ``agent_code`` (the agent's code raised, died or answered with no value,
    whatever the script made of it), ``missing_module`` (an import the agent's process was not asked for failed:
    ``name`` says which; the backend decides whether it was the agent's to provide) or ``failed`` (the script itself
    raised or exited non-zero: for a task that scores a file, the file was not what it expects).
    """
    if isinstance(exc, SystemExit) and exc.code in (0, None):
        return {"status": "finished"}
    if isinstance(exc, AgentCodeError) or (channel is not None and channel.failed):
        return {"status": "agent_code"}
    if isinstance(exc, ModuleNotFoundError):
        return {"status": "missing_module", "name": (exc.name or "").partition(".")[0]}
    return {"status": "failed"}


def _report(status, data: dict) -> None:
    if status is None:
        return
    try:
        status.write(json.dumps(data) + "\n")
        status.flush()
    except (OSError, ValueError):
        pass


# -- agent side ---------------------------------------------------------------------------------------------------
def serve(workspace: str, seed: int | None = None) -> None:
    """Answer the evaluator's requests about the agent's modules until the pipe closes.

    ``seed`` (the episode's agent seed, derived apart from the evaluator's) seeds ``random``, and numpy once the
    agent's code imported it, so a stochastic strategy is reproducible; this process never learns the evaluator's.
    """
    requests = os.fdopen(os.dup(0), "rb")
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8", errors="surrogatepass")
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)  # what the agent's code prints goes nowhere: only answers cross
    sys.path.insert(0, workspace)
    if seed is not None:
        random.seed(seed)
    while True:
        header = requests.read(8)
        if len(header) < 8:
            return
        request = pickle.loads(requests.read(struct.unpack("!Q", header)[0]))
        answers.write(json.dumps(_answer(request, seed)) + "\n")
        answers.flush()


def _answer(request: dict, seed: int | None) -> dict:
    try:
        op, module_name = request["op"], request["module"]
        if op == "import":
            importlib.import_module(module_name)
            numpy = sys.modules.get("numpy")
            if numpy is not None and seed is not None:
                numpy.random.seed(seed % 2**32)
            return {"value": None}
        module = importlib.import_module(module_name)
        name = request["name"]
        if op == "describe":
            if not hasattr(module, name):
                return {"value": "missing"}
            value = getattr(module, name)
            kind = "module" if isinstance(value, types.ModuleType) else "callable" if callable(value) else "value"
            return {"value": kind}
        function = getattr(module, name)
        if op == "get":
            return {"value": encode(function)}
        if op == "call":
            return {"value": encode(function(*request["args"], **request["kwargs"]))}
        if op == "map":
            return {"value": encode([function(*args) for args in request["calls"]])}
        return {"error": f"unknown request {op!r}"}
    except BaseException as exc:  # noqa: BLE001 - the agent's code may raise anything, SystemExit included
        return {"error": f"{type(exc).__name__}: {exc}"}


def main(argv: list[str]) -> None:
    """Command line: see the module's docstring."""
    role, rest = argv[0], argv[1:]
    options = {}
    while rest and rest[0] != "--":
        options[rest[0].lstrip("-")] = rest[1]
        rest = rest[2:]
    if role == "serve":
        serve(options["workspace"], int(options["seed"]) if options.get("seed", "").isdigit() else None)
    else:
        trusted = [n for n in options.get("trusted", "").split(",") if n]
        status_fd = int(options["status-fd"]) if options.get("status-fd", "").isdigit() else None
        evaluate(options["workspace"], trusted, options.get("fds", ""), rest[1:], status_fd)


if __name__ == "__main__":
    main(sys.argv[1:])
