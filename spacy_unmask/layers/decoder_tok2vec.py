"""`spacy_unmask.DecoderTok2Vec.v1`: a decoder LLM as a spaCy tok2vec layer.

A thin thinc layer around the torch `Backbone` (in a PyTorch shim): it plans
the docs, runs the backbone and hands one float32 row per token to the next
layer. The backbone is loaded when the pipeline is initialised, never when it
is built, so `spacy.load` rebuilds it from the saved bytes without a hub.
Its settings are `BackboneSettings` (one object, shared with the backbone);
`get_backbone` returns the backbone of a pipeline, component or layer.
"""
from functools import partial
from pathlib import Path
from typing import List

from spacy.tokens import Doc
from spacy.util import registry
from thinc.api import ArgsKwargs, Model, deserialize_attr, serialize_attr
from thinc.types import Floats2d

from ..settings import BackboneSettings, settings_signature

LAYER_NAME = "decoder_tok2vec"


def DecoderTok2Vec(**settings) -> Model[List[Doc], List[Floats2d]]:
    """A decoder LLM with a per-layer causal mask, as a tok2vec layer.

    Takes exactly the fields of `spacy_unmask.settings.BackboneSettings` as
    keyword arguments (its signature is made from them), each documented there.
    """
    return decoder_tok2vec(BackboneSettings(**settings))


DecoderTok2Vec.__signature__ = settings_signature(Model[List[Doc], List[Floats2d]])
registry.architectures("spacy_unmask.DecoderTok2Vec.v1")(DecoderTok2Vec)


def decoder_tok2vec(settings: BackboneSettings) -> Model[List[Doc], List[Floats2d]]:
    from thinc.api import PyTorchShim

    from ..saving import backbone_to_bytes

    shim = PyTorchShim(
        None,
        serialize_model=backbone_to_bytes,
        deserialize_model=partial(_backbone_from_bytes, settings=settings),
    )
    return Model(LAYER_NAME, forward, init=init, shims=[shim], dims={"nO": None}, attrs={"settings": settings})


def _backbone_from_bytes(_old, data: bytes, device, *, settings: BackboneSettings):
    from ..saving import backbone_from_bytes

    return backbone_from_bytes(data, settings, device)


def init(model: Model, X=None, Y=None) -> None:
    shim = model.shims[0]
    if shim._model is None:
        from thinc.util import get_torch_default_device

        from ..backbone import Backbone

        shim._model = Backbone.load(model.attrs["settings"]).to(get_torch_default_device())
    model.set_dim("nO", shim._model.hidden_size)


def forward(model: Model, docs: List[Doc], is_train: bool):
    shim = model.shims[0]
    backbone = shim._model
    if backbone is None:
        raise ValueError(
            "The decoder backbone is not loaded: call nlp.initialize() before training, "
            "or load a saved pipeline with spacy.load()"
        )
    from thinc.util import torch2xp, xp2torch

    batch = backbone.plan(docs)
    if not is_train:
        return [model.ops.asarray2f(torch2xp(t.float())) for t in backbone.predict(batch)], lambda d: []
    backbone.prepare_training()
    outputs, torch_backprop = shim(ArgsKwargs(args=(batch,), kwargs={}), is_train)
    vectors = [model.ops.asarray2f(torch2xp(t.detach().float())) for t in outputs]

    def backprop(d_vectors: List[Floats2d]) -> List[Doc]:
        keep = [i for i, t in enumerate(outputs) if t.requires_grad and t.numel()]
        if keep:
            grads = [xp2torch(d_vectors[i], device=outputs[i].device).to(outputs[i].dtype) for i in keep]
            torch_backprop(ArgsKwargs(args=([outputs[i] for i in keep],), kwargs={"grad_tensors": grads}))
        return []

    return vectors, backprop


# The settings live in the pipeline's config.cfg, which spaCy rebuilds the layer from
# (overrides at `spacy.load` included); the copy in the model file is for reading only.
@serialize_attr.register(BackboneSettings)
def _settings_to_bytes(_, value: BackboneSettings, name: str, model: Model) -> bytes:
    import srsly

    return srsly.msgpack_dumps({**value.to_dict(), "name": portable_name(value.name, value.save_mode)})


def portable_name(name: str, save_mode: str) -> str:
    """The setting `name` as a saved pipeline keeps it: a full pipeline holds its model, so
    of a path only the last part is kept (where its author kept the model is no one's business)."""
    from ..base_model import base_kind

    return Path(name).name if save_mode == "full" and base_kind(name) == "path" else name


def hide_machine_paths(nlp, pipe_name: str) -> None:
    """Replace the path in `name` of every full-mode backbone block in the config of
    `pipe_name` by its last part, once the backbone is loaded (config.cfg is written from it)."""
    def walk(block):
        if isinstance(block, dict):
            if block.get("@architectures") == "spacy_unmask.DecoderTok2Vec.v1" and isinstance(block.get("name"), str):
                block["name"] = portable_name(block["name"], block.get("save_mode", "full"))
            for value in block.values():
                walk(value)

    walk(nlp.get_pipe_config(pipe_name))


@deserialize_attr.register(BackboneSettings)
def _settings_from_bytes(current: BackboneSettings, data: bytes, name: str, model: Model) -> BackboneSettings:
    return current


def require_loaded_backbones(obj) -> None:
    """Refuse a loaded pipeline or component with a backbone that its saved state did not
    provide: it would load the base model named in its config at nlp.initialize()."""
    from spacy.language import Language

    from ..opt_ins import UnsafePipelineError

    components = obj.components if isinstance(obj, Language) else [(obj.name, obj)]
    for name, component in components:
        model = getattr(component, "model", None)
        nodes = model.walk() if isinstance(model, Model) else ()
        if any(node.name == LAYER_NAME and node.shims[0]._model is None for node in nodes):
            raise UnsafePipelineError(
                f"[{name}] the saved component holds no state for its decoder backbone: the pipeline is damaged "
                "or hostile (it would load the base model named in its config instead)"
            )


def get_backbone(obj, pipe_name=None):
    """The torch `Backbone` of a pipeline (`Language`), a component, or a thinc model.

    With several backbones in a pipeline, name the component with `pipe_name`.
    Raises if the backbone has not been loaded yet (call `nlp.initialize()`).
    """
    from spacy.language import Language

    if isinstance(obj, Language):
        names = [pipe_name] if pipe_name else obj.pipe_names
        found = {}
        for name in names:
            model = getattr(obj.get_pipe(name), "model", None)
            if isinstance(model, Model):
                layer = _find_layer(model)
                if layer is not None:
                    found.setdefault(id(layer), (name, layer))
        if not found:
            raise ValueError(f"no spacy_unmask backbone in the pipes {names}")
        if len(found) > 1:
            raise ValueError(f"several backbones (in {[n for n, _ in found.values()]}): pass pipe_name")
        (_, layer), = found.values()
    else:
        model = obj if isinstance(obj, Model) else getattr(obj, "model", None)
        layer = _find_layer(model) if isinstance(model, Model) else None
        if layer is None:
            raise ValueError(f"{type(obj).__name__} holds no spacy_unmask backbone")
    backbone = layer.shims[0]._model
    if backbone is None:
        raise ValueError("the backbone is not loaded yet: call nlp.initialize() or spacy.load() first")
    return backbone


def _find_layer(model: Model):
    return next((node for node in model.walk() if node.name == LAYER_NAME), None)
