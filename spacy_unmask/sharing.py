"""Loading a pipeline from anyone, saving one safely, and the digest of what was loaded.

`spacy_unmask.load(path, **kwargs)` is `spacy.load` for a pipeline from someone else:
the whole folder (its `config.cfg` and `meta.json` included, which `spacy.load` reads
before any plugin code runs) and its config are checked first (`pipeline_files.py`),
every decoder backbone must come from the saved state, and whatever fails is an
`UnsafePipelineError` that echoes no value of the pipeline's files.

`spacy_unmask.save(nlp, path)` is `nlp.to_disk(path)` that first refuses a target folder
holding a link, FIFO or device anywhere: `nlp.to_disk` writes `config.cfg`, `meta.json`,
the tokenizer and the vocab itself, before any component can check its own folder.

`loaded_digest(nlp)` is the SHA-256 of a pipeline as it was loaded, which `annotate`
compares before resuming a run.
"""
import hashlib
from pathlib import Path

from .layers.decoder_tok2vec import LAYER_NAME, require_loaded_backbones
from .opt_ins import UnsafePipelineError
from .pipeline_files import check_config, check_folder
from .settings import BackboneSettings

ARCHITECTURE = "spacy_unmask.DecoderTok2Vec.v1"
# spacy.load's own keywords; every other keyword is a backbone setting.
SPACY_KEYWORDS = ("vocab", "disable", "enable", "exclude", "config")


def load(path, **kwargs):
    """spacy.load(path) for a pipeline from anyone. Takes spacy.load's keywords (`disable`,
    `enable`, `exclude`, `config`, `vocab`) and backbone settings (e.g. quantize="int8"),
    which change every spacy_unmask.DecoderTok2Vec.v1 block of its config, wherever it
    sits, at load time."""
    import spacy
    from spacy.util import dict_to_dot, load_config

    settings = {k: v for k, v in kwargs.items() if k not in SPACY_KEYWORDS}
    unknown = set(settings) - set(BackboneSettings.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown keywords {sorted(unknown)}: neither spacy.load's nor backbone settings")
    check_folder(path)
    try:
        config = load_config(Path(path) / "config.cfg", interpolate=False)
    except Exception:  # spaCy's parse errors quote the lines they fail on
        raise UnsafePipelineError("the pipeline's config.cfg is not a config spaCy can read") from None
    check_config(config)
    overrides = dict_to_dot(kwargs.pop("config", None) or {}, for_overrides=True)
    backbones = []

    def walk(block, at):
        if isinstance(block, dict):
            if block.get("@architectures") == ARCHITECTURE:
                backbones.append(at)
                for key, value in settings.items():
                    overrides[".".join(at + [key])] = value
            for key, value in block.items():
                walk(value, at + [key])

    walk(config, [])
    if settings and not backbones:
        raise ValueError(f"{path}: no {ARCHITECTURE} backbone in the pipeline's config")
    spacy_kwargs = {k: v for k, v in kwargs.items() if k in SPACY_KEYWORDS}
    try:
        nlp = spacy.load(path, config=overrides, **spacy_kwargs)
    except UnsafePipelineError:
        raise
    except Exception as err:  # spaCy's and the settings' messages quote config values
        raise UnsafePipelineError(
            f"the pipeline does not load ({type(err).__name__}{_where(err)}): it is damaged, hostile, or saved "
            "by an incompatible version"
        ) from None
    require_loaded_backbones(nlp)
    return nlp


def _where(err) -> str:
    """The config fields a spaCy config error is about, without their values."""
    fields = [".".join(map(str, e.get("loc", ()))) for e in getattr(err, "errors", None) or () if isinstance(e, dict)]
    return f" at {', '.join(fields[:5])}" if fields else ""


def save(nlp, path) -> None:
    """nlp.to_disk(path), refused before anything is written where `path` or anything in
    it is a link, FIFO, socket or device (the write would land elsewhere, or stall)."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        check_folder(path, action="saved into")
    nlp.to_disk(path)


def loaded_digest(nlp) -> str:
    """SHA-256 of a pipeline as loaded: its config and spaCy tokenizer; each decoder
    backbone by the digest of what it was rebuilt from (`saving.loaded_digest`: its
    config, tokenizer files and weights as read, and an adapter's base as found); the
    other weights and settings of its component by value; every other component by its
    bytes."""
    import srsly
    from thinc.api import Model

    digest = hashlib.sha256()

    def add(data: bytes) -> None:
        digest.update(len(data).to_bytes(8, "little") + data)

    add(nlp.config.to_str().encode("utf-8"))
    add(nlp.tokenizer.to_bytes(exclude=["vocab"]))
    for name, component in nlp.components:
        add(name.encode("utf-8"))
        model = getattr(component, "model", None)
        nodes = list(model.walk()) if isinstance(model, Model) else []
        if not any(node.name == LAYER_NAME for node in nodes):
            add(component.to_bytes(exclude=["vocab"]) if hasattr(component, "to_bytes") else b"")
            continue
        require_loaded_backbones(component)
        add(srsly.msgpack_dumps(getattr(component, "cfg", {})))
        for node in nodes:
            if node.name == LAYER_NAME:
                loaded = getattr(node.shims[0]._model, "loaded_sha256", None)
                if loaded is None:
                    raise ValueError(f"[{name}] the decoder backbone was not loaded from a saved pipeline")
                add(loaded.encode("ascii"))
            for param in node.param_names:
                if node.has_param(param):
                    add(param.encode("utf-8") + node.ops.to_numpy(node.get_param(param)).tobytes())
    return digest.hexdigest()
