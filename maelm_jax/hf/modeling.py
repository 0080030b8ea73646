"""PyTorch RoBERTa with MAE-LM's shared relative position bias, for `trust_remote_code`.

`python -m maelm_jax.export` copies this file into an export as `modeling_maelm.py` when the
encoder uses the relative position bias, which no native HuggingFace class represents
exactly (MPNet's bias uses T5's bucket function, see docs/export.md). It imports only torch and
transformers, never maelm_jax: the export must load where maelm_jax is not installed.

Everything but the bias is RoBERTa's own modules (embeddings, layers, LM, classification and
span heads), so parameter names and numerics are `RobertaModel`'s (`qa_outputs` is
`RobertaForQuestionAnswering`'s, as `run_qa.py` expects). The bias is looked up in the bucket
table stored in config.json (`relative_attention_bucket_table`, computed by maelm_jax at
export): entry `d + max_positions - 1` is the bucket of offset `key - query = d`.

The sequence classifier reads only `<s>`, so its last layer runs the query, the attention
output and the MLP at position 0 alone (`first_token_layer`): the same numbers at position 0,
a quarter less arithmetic in a 4-layer encoder.
"""

import torch
from torch import nn
from transformers import RobertaConfig
from transformers.modeling_outputs import (
    BaseModelOutput,
    MaskedLMOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
)
from transformers.models.roberta.modeling_roberta import (
    RobertaClassificationHead,
    RobertaEmbeddings,
    RobertaLayer,
    RobertaLMHead,
    RobertaPreTrainedModel,
)


class MaelmConfig(RobertaConfig):
    """RoBERTa's config plus the bias: `relative_attention_num_buckets` rows of per-head
    biases and the offset -> bucket table (length 2 * (max_position_embeddings - 2) - 1).
    Its model_type is RoBERTa's: config.json says "roberta", so that AutoTokenizer and
    AutoConfig load an export without remote code, and a config saved from this class says
    the same."""

    model_type = "roberta"

    def __init__(
        self,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        relative_attention_bucket_table=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.relative_attention_num_buckets = relative_attention_num_buckets
        self.relative_attention_max_distance = relative_attention_max_distance
        self.relative_attention_bucket_table = relative_attention_bucket_table or []


class MaelmPreTrainedModel(RobertaPreTrainedModel):
    """RoBERTa's initialisation (also of the embeddings' buffers). The bucket table is a
    non-persistent buffer filled from config.json here: the weights file does not hold it,
    and building it in `forward` instead cost a blocking host-to-device copy every step."""

    config_class = MaelmConfig
    base_model_prefix = "roberta"

    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, MaelmEncoder):
            with torch.no_grad():
                module.bucket_table.copy_(_table(self.config))


def _table(config) -> torch.Tensor:
    return torch.tensor(list(config.relative_attention_bucket_table), dtype=torch.long)


def first_token_layer(layer, hidden_states, attention_mask):
    """A `RobertaLayer` at position 0 alone: hidden_states [B, T, E] -> [B, 1, E], the full
    layer's row 0 (its query, attention output and MLP; keys and values from every position).
    attention_mask: None, or broadcastable to [B, N, T, T] (bool, or additive float)."""
    attention = layer.attention.self
    b, t, _ = hidden_states.shape
    d = attention.attention_head_size

    def heads(x, n):
        return x.view(b, n, -1, d).transpose(1, 2)

    query = heads(attention.query(hidden_states[:, :1]), 1)
    key = heads(attention.key(hidden_states), t)
    value = heads(attention.value(hidden_states), t)
    if attention_mask is not None and attention_mask.dim() == 4 and attention_mask.shape[2] > 1:
        attention_mask = attention_mask[:, :, :1]
    context = nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=attention.dropout.p if attention.training else 0.0,
        scale=attention.scaling,
    )
    context = context.transpose(1, 2).reshape(b, 1, -1)
    return layer.feed_forward_chunk(layer.attention.output(context, hidden_states[:, :1]))


class MaelmEncoder(nn.Module):
    """RoBERTa layers; every layer adds the same bias [B, N, T, T] to its attention scores."""

    def __init__(self, config):
        super().__init__()
        self.layer = nn.ModuleList(
            RobertaLayer(config, layer_idx=i) for i in range(config.num_hidden_layers)
        )
        self.relative_attention_bias = nn.Embedding(
            config.relative_attention_num_buckets, config.num_attention_heads
        )
        self.register_buffer("bucket_table", _table(config), persistent=False)
        self.max_positions = config.max_position_embeddings - 2

    def forward(self, hidden_states, positions, key_mask, first_token_only=False):
        """hidden_states [B, T, E]; positions [B, T] 0-based; key_mask bool [B, T] ->
        [B, T, E], or [B, 1, E] (`<s>`'s row) with `first_token_only`.

        Under autocast the bias is cast to the compute dtype once here; in float32 each
        layer's attention would cast it again."""
        # One ATen call per operation: a fine-tuning step on a CPU pays for each dispatch.
        offsets = positions.unsqueeze(1) - positions.unsqueeze(2) + (self.max_positions - 1)
        offsets = offsets.clamp(0, self.bucket_table.numel() - 1)  # out of range only at padding
        bias = self.relative_attention_bias(self.bucket_table[offsets]).permute(0, 3, 1, 2)
        dtype = hidden_states.dtype
        if torch.is_autocast_enabled(hidden_states.device.type):
            dtype = torch.get_autocast_dtype(hidden_states.device.type)
        blocked = torch.finfo(dtype).min
        padding = key_mask.logical_not().view(key_mask.shape[0], 1, 1, key_mask.shape[1])
        scores_bias = bias.to(dtype).masked_fill(padding, blocked)
        last = len(self.layer) - 1
        for i, layer in enumerate(self.layer):
            if first_token_only and i == last:
                return first_token_layer(layer, hidden_states, scores_bias)
            out = layer(hidden_states, attention_mask=scores_bias)
            hidden_states = out[0] if isinstance(out, tuple) else out
        return hidden_states


class MaelmModel(MaelmPreTrainedModel):
    """The encoder: [B, T] ids -> last_hidden_state [B, T, E]."""

    def __init__(self, config, add_pooling_layer=False):
        super().__init__(config)
        self.embeddings = RobertaEmbeddings(config)
        self.encoder = MaelmEncoder(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        return_dict=True,
        first_token_only=False,
        **kwargs,
    ):
        pad = self.config.pad_token_id
        if attention_mask is None:
            attention_mask = input_ids != pad
        key_mask = attention_mask.bool()
        # RoBERTa's positions: padding_idx + 1 + index among the non-padding tokens.
        ones = key_mask.long()
        position_ids = torch.cumsum(ones, dim=1) * ones + pad
        hidden = self.embeddings(
            input_ids=input_ids,
            position_ids=position_ids,
            token_type_ids=torch.zeros_like(input_ids),
        )
        hidden = self.encoder(hidden, position_ids - (pad + 1), key_mask, first_token_only)
        if not return_dict:
            return (hidden,)
        return BaseModelOutput(last_hidden_state=hidden)


class MaelmForMaskedLM(MaelmPreTrainedModel):
    _tied_weights_keys = {  # noqa: RUF012 (transformers reads the class attribute)
        "lm_head.decoder.weight": "roberta.embeddings.word_embeddings.weight",
        "lm_head.decoder.bias": "lm_head.bias",
    }

    def __init__(self, config):
        super().__init__(config)
        self.roberta = MaelmModel(config)
        self.lm_head = RobertaLMHead(config)
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head.decoder

    def set_output_embeddings(self, new_embeddings):
        self.lm_head.decoder = new_embeddings

    def forward(self, input_ids=None, attention_mask=None, labels=None, return_dict=True, **kwargs):
        hidden = self.roberta(input_ids, attention_mask=attention_mask).last_hidden_state
        logits = self.lm_head(hidden)
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1))
        if not return_dict:
            return (logits,) if loss is None else (loss, logits)
        return MaskedLMOutput(loss=loss, logits=logits)


class MaelmForSequenceClassification(MaelmPreTrainedModel):
    """RoBERTa's classification head on the `<s>` vector (GLUE fine-tuning). The encoder's
    last layer computes that row alone; `first_token_only = False` runs it whole (the same
    logits, for comparison)."""

    first_token_only = True

    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.roberta = MaelmModel(config)
        self.classifier = RobertaClassificationHead(config)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, labels=None, return_dict=True, **kwargs):
        hidden = self.roberta(
            input_ids, attention_mask=attention_mask, first_token_only=self.first_token_only
        ).last_hidden_state
        logits = self.classifier(hidden)
        loss = None
        if labels is not None:
            if self.num_labels == 1:
                loss = nn.functional.mse_loss(logits.squeeze(-1), labels.float())
            else:
                loss = nn.functional.cross_entropy(logits, labels.view(-1))
        if not return_dict:
            return (logits,) if loss is None else (loss, logits)
        return SequenceClassifierOutput(loss=loss, logits=logits)


class MaelmForQuestionAnswering(MaelmPreTrainedModel):
    """Extractive QA (SQuAD): a linear start/end head on every position, as
    `RobertaForQuestionAnswering` (`qa_outputs`, hidden -> 2). Logits [B, T] each; the loss is
    (CE_start + CE_end) / 2, positions outside [0, T) clamped to T and ignored, as there."""

    def __init__(self, config):
        super().__init__(config)
        self.roberta = MaelmModel(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        start_positions=None,
        end_positions=None,
        return_dict=True,
        **kwargs,
    ):
        hidden = self.roberta(input_ids, attention_mask=attention_mask).last_hidden_state
        start_logits, end_logits = self.qa_outputs(hidden).unbind(-1)
        loss = None
        if start_positions is not None and end_positions is not None:
            ignored = start_logits.size(1)
            start = start_positions.reshape(-1).clamp(0, ignored)
            end = end_positions.reshape(-1).clamp(0, ignored)
            loss = (
                nn.functional.cross_entropy(start_logits, start, ignore_index=ignored)
                + nn.functional.cross_entropy(end_logits, end, ignore_index=ignored)
            ) / 2
        if not return_dict:
            out = (start_logits, end_logits)
            return out if loss is None else (loss, *out)
        return QuestionAnsweringModelOutput(
            loss=loss, start_logits=start_logits, end_logits=end_logits
        )
