"""Which transformers class loads a text model's network, for every backend that loads one
(torch serves it, the ONNX exporter traces it).

An encoder loads with ``AutoModel``, except the encoder of an encoder-decoder model: there
``AutoModel`` gives the whole seq2seq model (``T5Model``), whose forward runs the decoder
and fails without decoder inputs. sentence-transformers loads only the encoder for these
configs (``Transformer._load_encoder_only_model``), keyed by the config's type and not
its ``architectures`` (sentence-t5 and GTR name ``T5EncoderModel``, a fine-tuned T5 may
name ``T5ForConditionalGeneration``); so does Ember.
"""

from __future__ import annotations

from typing import Any

from ember.models.spec import ResolvedModel

# model_type -> its encoder-only class: sentence-transformers' text rows of the same table.
ENCODER_ONLY = {
    "t5": "T5EncoderModel",
    "mt5": "MT5EncoderModel",
    "umt5": "UMT5EncoderModel",
    "longt5": "LongT5EncoderModel",
}


def network_class(model: ResolvedModel) -> Any:
    """The transformers class whose ``from_pretrained`` loads ``model``'s network: the
    encoder (alone, for a seq2seq type), the causal LM of an LLM reranker, or the
    sequence classifier of a reranker or classifier."""
    import transformers

    if model.backbone == "causal-lm":
        return transformers.AutoModelForCausalLM
    if model.backbone != "encoder":
        return transformers.AutoModelForSequenceClassification
    return getattr(transformers, ENCODER_ONLY.get(model.model_type, "AutoModel"))
