"""An LLM reranker's prompt around each (query, document) pair, tokenised as its family's
reference tokenises it: which pieces are encoded alone (a BPE merges across a piece's
boundary otherwise), what is cut first and to how many tokens. The ids are then the
reference's ids, and so are the logits.

- qwen3-reranker (the model card's ``format_instruction`` / ``process_inputs``): the chat
  prefix with its system prompt, then ``<Instruct>: {instruction}\\n<Query>: {query}\\n
  <Document>: {document}`` encoded as one text and cut to 8,192 tokens less the prefix and
  suffix, then the assistant suffix with an empty think block.
- mxbai-rerank-v2 (``MxbaiRerankV2.prepare_inputs``): ``query: {query}`` (after
  ``instruction: {instruction}\\n`` when there is one) cut to 3/4 of 8,192, a newline and
  ``document: {document}`` cut to what is left, then a newline, its task prompt and the chat
  suffix, all inside its chat prefix.
- bge-reranker-v2-gemma (FlagEmbedding's ``BaseLLMReranker``): ``<bos>``, ``A: {query}`` cut
  to 384 tokens, a newline and ``B: {document}`` cut to 512 (the pair to 512 plus the
  prompt), then a newline and the prompt.

The prompt ends where the answer token would be, so the backend scores each input's last
position; inputs are right-padded like every other model's.
"""

from __future__ import annotations

from collections.abc import Callable

from ember.batch import Tokens
from ember.errors import BadRequest
from ember.families.llm_reranker.templates import LlmReranker
from ember.models.spec import ResolvedModel
from ember.processors.text import TextTokenizer, declared_token_ids

QWEN3_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n"
)
QWEN3_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
MXBAI_PREFIX = (
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\n<|im_start|>user\n"
)
MXBAI_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
MXBAI_TASK = (
    "You are a search relevance expert who evaluates how well documents match search queries. "
    "For each query-document pair, carefully analyze the semantic relationship between them, "
    "then provide your binary relevance judgment (0 for not relevant, 1 for relevant).\n"
    "Relevance:"
)
SEP = "\n"

# One prompt: its ids and how many the pieces took before anything was cut.
Prompt = tuple[list[int], int]


class LlmRerankTokenizer(TextTokenizer):
    """``encode_pairs`` builds the family's prompt; ``instruction`` (a request's) replaces
    the one the model is served with. ``max_length`` is the longest prompt it builds."""

    def __init__(self, model: ResolvedModel, max_length: int | None = None) -> None:
        super().__init__(model, max_length)
        facts = model.facts
        assert isinstance(facts, LlmReranker)
        self.template = facts.template
        self.instruction = facts.instruction
        self.positions = self.max_length  # what the network takes
        layouts: dict[str, Callable[[str, list[str], str | None], list[Prompt]]] = {
            "qwen3-reranker": self._qwen3,
            "mxbai-rerank-v2": self._mxbai,
            "bge-reranker-v2-gemma": self._flag,
        }
        self._layout = layouts[self.template.name]
        self._sep = self._ids(SEP)
        if self.template.name == "qwen3-reranker":
            self._prefix_ids, self._suffix_ids = self._ids(QWEN3_PREFIX), self._ids(QWEN3_SUFFIX)
            self.max_length = min(self.template.max_length, self.positions)
        elif self.template.name == "mxbai-rerank-v2":
            self._prefix_ids, self._suffix_ids = self._ids(MXBAI_PREFIX), self._ids(MXBAI_SUFFIX)
            self._task_ids = self._ids(MXBAI_TASK)
            fixed = len(self._prefix_ids) + len(self._task_ids) + len(self._suffix_ids)
            self._fixed = fixed + len(self._sep)
            # prepare_predefined_inputs: the budget shrinks to fit the model's positions
            self._budget = min(self.template.max_length, self.positions - self._fixed)
            self.max_length = self._budget + self._fixed
        else:
            declared = declared_token_ids(self._exact, model.path, ("bos_token", "pad_token"))
            bos = declared.get("bos_token")
            self._bos = [bos] if bos is not None and bos != declared.get("pad_token") else []
            self._budget = self.template.max_length
            prompt = len(self._ids(self.instruction or ""))
            self.max_length = len(self._bos) + self._budget + 2 * (len(self._sep) + prompt)

    def _ids(self, text: str) -> list[int]:
        return self._exact.encode(text, add_special_tokens=False).ids

    def _many(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._exact.encode_batch(texts, add_special_tokens=False)]

    def encode_pairs(
        self,
        pairs: list[tuple[str, str]],
        *,
        truncate: bool = True,
        instruction: str | None = None,
    ) -> list[Tokens]:
        """One prompt per pair, the pairs of each query built together."""
        chosen = instruction if instruction is not None else self.instruction
        by_query: dict[str, list[int]] = {}
        for i, (query, _) in enumerate(pairs):
            by_query.setdefault(query, []).append(i)
        out: list[Tokens | None] = [None] * len(pairs)
        for query, rows in by_query.items():
            prompts = self._layout(query, [pairs[i][1] for i in rows], chosen)
            for i, (ids, full) in zip(rows, prompts, strict=True):
                out[i] = self._checked_prompt(ids, full, truncate)
        return [t for t in out if t is not None]

    def _checked_prompt(self, ids: list[int], full: int, truncate: bool) -> Tokens:
        if len(ids) == full:
            return Tokens(ids, [0] * len(ids))
        if not truncate:
            raise BadRequest(
                f"query and document take {full} tokens in the {self.template.name} prompt, more "
                f"than it keeps (at most {self.max_length}); send truncate=true or shorten them",
                param="documents",
            )
        return Tokens(ids, [0] * len(ids), truncated_from=full)

    def _qwen3(self, query: str, docs: list[str], instruction: str | None) -> list[Prompt]:
        prefix, suffix = self._prefix_ids, self._suffix_ids
        room = self.max_length - len(prefix) - len(suffix)
        texts = [f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {d}" for d in docs]
        fixed = len(prefix) + len(suffix)
        return [(prefix + ids[:room] + suffix, len(ids) + fixed) for ids in self._many(texts)]

    def _mxbai(self, query: str, docs: list[str], instruction: str | None) -> list[Prompt]:
        budget = self._budget
        text = (
            f"instruction: {instruction}{SEP}query: {query}" if instruction else f"query: {query}"
        )
        query_full = self._ids(text)
        query_ids = query_full[: budget * 3 // 4]  # room kept for the document
        doc_room = min(self.positions - len(query_ids) - self._fixed, budget)
        prompts = []
        for doc_full in self._many([f"document: {d}" for d in docs]):
            second = (self._sep + doc_full[:doc_room])[: budget - len(query_ids)]
            ids = self._prefix_ids + query_ids + second
            ids += self._sep + self._task_ids + self._suffix_ids
            full = len(query_full) + len(self._sep) + len(doc_full) + self._fixed
            prompts.append((ids, full))
        return prompts

    def _flag(self, query: str, docs: list[str], instruction: str | None) -> list[Prompt]:
        budget = self._budget
        prompt = self._ids(instruction or "")
        query_full = self._ids(f"A: {query}")
        first = self._bos + query_full[: budget * 3 // 4]
        limit = budget + len(self._sep) + len(prompt)  # the pair, as prepare_for_model cuts it
        prompts = []
        for doc_full in self._many([f"B: {d}" for d in docs]):
            second = (self._sep + doc_full[:budget])[: max(limit - len(first), 0)]
            ids = first + second + self._sep + prompt
            full = len(self._bos) + len(query_full) + len(doc_full) + 2 * len(self._sep)
            prompts.append((ids, full + len(prompt)))
        return prompts
