"""Tiny randomly initialised decoders of every supported family, built from configs."""
import transformers

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3")
# Small enough that a window of 4 pieces matters in a 12-piece test sentence.
SLIDING_WINDOW = 4
VOCAB_SIZE = 320
TRAINING_TEXT = [
    "Peter Blackburn visited the European Commission in Brussels on Monday .",
    "German officials said the ban would last until scientists found a cure .",
    "EU rejects German call to boycott British lamb .",
    "The capital of Germany is Berlin , and Paris is the capital of France .",
    "Emoji 😀 , CJK 東京 , Arabic مرحبا and combining e\u0301 characters .",
]


def tiny_config(family: str, *, num_layers: int = 4, sliding: bool = True):
    common = dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    window = SLIDING_WINDOW if sliding else None
    if family == "llama":
        return transformers.LlamaConfig(**common)
    if family == "mistral":
        return transformers.MistralConfig(sliding_window=window, **common)
    if family == "qwen2":
        return transformers.Qwen2Config(
            use_sliding_window=sliding, sliding_window=SLIDING_WINDOW, max_window_layers=num_layers // 2, **common
        )
    if family == "qwen3":
        return transformers.Qwen3Config(head_dim=8, **common)
    if family == "gemma":
        return transformers.GemmaConfig(head_dim=8, **common)
    if family == "gemma2":
        return transformers.Gemma2Config(head_dim=8, sliding_window=SLIDING_WINDOW, **common)
    if family == "gemma3_text":
        return transformers.Gemma3TextConfig(
            head_dim=8, sliding_window=SLIDING_WINDOW, sliding_window_pattern=2, **common
        )
    if family == "phi3":
        common.pop("num_key_value_heads")
        return transformers.Phi3Config(sliding_window=window, num_key_value_heads=4, **common)
    raise ValueError(family)


def tiny_decoder(family: str, *, attn_implementation: str = "sdpa", seed: int = 0, **kwargs):
    import torch

    torch.manual_seed(seed)
    config = tiny_config(family, **kwargs)
    config._attn_implementation = attn_implementation
    lm = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)
    return lm.get_decoder().eval()


def tiny_tokenizer(style: str = "bytelevel"):
    """A fast BPE tokenizer trained on a few sentences: GPT-2 style ("bytelevel",
    like SmolLM2) or SentencePiece style with a BOS piece ("metaspace", like Llama/Gemma)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    special = ["<pad>", "<s>", "</s>"]
    tokenizer = Tokenizer(models.BPE(unk_token=None, byte_fallback=style == "metaspace"))
    if style == "bytelevel":
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
        alphabet = [f"<0x{i:02X}>" for i in range(256)]
        special = special + alphabet
        alphabet = []
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=special, initial_alphabet=alphabet)
    tokenizer.train_from_iterator(TRAINING_TEXT, trainer)
    if style == "metaspace":
        from tokenizers import processors

        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
        )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


def save_tiny_model(path, family: str = "llama", style: str = "bytelevel", seed: int = 0, **kwargs) -> str:
    """A save_pretrained directory with a tiny random model and tokenizer."""
    import torch

    torch.manual_seed(seed)
    config = tiny_config(family, **kwargs)
    lm = transformers.AutoModelForCausalLM.from_config(config)
    lm.save_pretrained(str(path))
    tiny_tokenizer(style).save_pretrained(str(path))
    return str(path)


def tiny_backbone(decoder, unmask: str = "all", **settings):
    """A `Backbone` around an in-memory decoder (no files), frozen, float32."""
    from spacy_unmask.backbone import Backbone
    from spacy_unmask.settings import BackboneSettings

    settings = BackboneSettings(name="tiny", unmask=unmask, finetune="frozen", dtype="float32", **settings)
    return Backbone(decoder, tiny_tokenizer(), settings, None)
