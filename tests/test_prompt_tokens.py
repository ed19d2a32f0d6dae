"""Prompts as token ids, kept per dialogue between turns (personalens/engines/chat/token_ids.py): for every
role, fidelity option, prompt family and setting, on the bundled sample and on the release excerpt,
the ids made from the previous prompt's ids and a tokenized middle equal what the chat template plus
the tokenizer give for the whole prompt."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from personalens.data import load_scenarios
from personalens.data.records import Turn
from personalens.engines.chat.token_ids import ChatTokenizer, PromptIds, common_prefix, common_suffix
from personalens.engines.models.config import ModelConfig
from personalens.paths import PROJECT_ROOT
from personalens.prompts.render import FAMILIES, assistant_messages, user_agent_messages
from personalens.prompts.setting import PromptSetting
from personalens.prompts.templates import load_templates

TEMPLATE_SETS = {
    "official": dict(folder=PROJECT_ROOT / "prompts" / "official", style="official", verbatim=True),
    "paper": dict(folder=None, style="paper", verbatim=False),
}
SETTINGS = [PromptSetting("base"), PromptSetting("vanilla"), PromptSetting("base", True, True, True)]
# replies as models write them: words, punctuation, numbers, lists, newlines, quotes, non-ASCII, TERMINATE
PIECES = [
    "Sure", "I'd", "recommend", "the", "Italian", "place", "on", "Main", "Street.", "It", "opens", "at",
    "7:30pm,", "costs", "$25", "per", "person", "(tip", "included).", "\n", "\n\n", "1.", "2)", "-",
    "**Note:**", "café", "naïve", "東京", "😀", "TERMINATE", "'quoted'", '"double"', "  ", "\t", "100%",
    "e-mail:", "x@y.com", "...", "—", "Okay,", "thanks!", "What", "about", "Tuesday?",
]  # fmt: skip


def reply(rng: random.Random) -> str:
    if rng.random() < 0.03:
        return ""  # a model may say nothing
    return " ".join(rng.choice(PIECES) for _ in range(rng.randint(1, 60))).strip() or "ok"


@pytest.fixture(scope="module")
def tokenizer() -> ChatTokenizer:
    return ChatTokenizer.load(ModelConfig(name="SmolLM2-135M-Instruct"))


def scenarios(root: Path, n: int) -> list:
    found = load_scenarios(root)
    return random.Random(0).sample(found, min(n, len(found)))


def grow_and_compare(tokenizer: ChatTokenizer, prompt_of, scenarios_, rng: random.Random, rounds: int) -> PromptIds:
    """Grow one dialogue per scenario in lockstep (each step one `ids` call with every active
    dialogue's prompt for the role, some dialogues ending early); every prompt's kept ids must equal a
    full tokenization of the role's whole prompt. Returns the PromptIds, whose counts say how much
    was tokenized, and checks that this was well under the prompts' total."""
    kept = PromptIds(tokenizer, verify_first=0, verify_every=0)  # no internal checks: this test is the check
    active = {scenario.key: (scenario, []) for scenario in scenarios_}
    total = 0
    for step in range(rounds * 2):
        role = "user" if step % 2 == 0 else "assistant"
        batch = [((key, role), role, prompt_of(scenario, turns, role)) for key, (scenario, turns) in active.items()]
        made = kept.ids(batch)
        for (key, _, _), ids, full in zip(batch, made, tokenizer.encode_chats([m for _, _, m in batch])):
            assert ids == full, (key, len(active[key[0]][1]))
            total += len(ids)
        for key, (_, turns) in list(active.items()):
            turns.append(Turn(role, reply(rng)))
            if role == "assistant" and rng.random() < 0.1:  # ended: its prompts are forgotten
                kept.forget([(key, "user"), (key, "assistant")])
                del active[key]
    assert kept.stats.tokenized < total / 2
    return kept


def template_set(fidelity: str):
    spec = TEMPLATE_SETS[fidelity]
    return load_templates(spec["folder"], style=spec["style"], verbatim=spec["verbatim"])


def prompts_of(templates, setting: PromptSetting, family: str):
    def prompt_of(scenario, turns, role):
        if role == "user":
            return user_agent_messages(templates, scenario, turns)
        return assistant_messages(templates, scenario, turns, setting, family)

    return prompt_of


@pytest.mark.parametrize("fidelity", sorted(TEMPLATE_SETS))
@pytest.mark.parametrize("family", FAMILIES)
def test_kept_ids_equal_a_full_tokenization_for_every_role_and_layout(tokenizer, sample_root, fidelity, family):
    templates = template_set(fidelity)
    rng = random.Random(f"{fidelity}-{family}")
    for setting in SETTINGS:
        kept = grow_and_compare(tokenizer, prompts_of(templates, setting, family), scenarios(sample_root, 12), rng, 6)
        # the point of it: most prompts were made from the previous ones, not tokenized whole
        assert kept.stats.spliced > 5 * kept.stats.full
        if fidelity == "official":  # the user agent's fixed instructions after the conversation are kept
            assert kept.stats.reused_ends > kept.stats.spliced // 4


def test_kept_ids_from_the_tokenizer_files_are_spliced_and_exact(tokenizer, sample_root):
    """A server engine measures prompts with the tokenizer's files (engines/serving/engine.py): kept ids made
    from them, with their tokens' offsets, equal a full tokenization by the files and by transformers."""
    files = ChatTokenizer.from_files(ModelConfig(name="SmolLM2-135M-Instruct"))
    setting = PromptSetting("base", True, True, True)
    prompt_of = prompts_of(template_set("official"), setting, "default")
    kept = grow_and_compare(files, prompt_of, scenarios(sample_root, 6), random.Random(3), 4)
    assert kept.stats.spliced > 5 * kept.stats.full
    texts = [files.render(prompt_of(s, [], "user")) for s in scenarios(sample_root, 3)]
    assert [ids for ids, _ in files.encode_ends(texts)] == tokenizer.encode(texts)
    assert [list(ends) for _, ends in files.encode_ends(texts)] == [
        list(ends) for _, ends in tokenizer.encode_ends(texts)
    ]


@pytest.mark.parametrize("fidelity", sorted(TEMPLATE_SETS))
@pytest.mark.parametrize("family", FAMILIES)
def test_kept_ids_on_the_release_excerpt(tokenizer, shared_data_root, fidelity, family):
    templates = template_set(fidelity)
    rng = random.Random(f"excerpt-{fidelity}-{family}")
    for setting in (PromptSetting("base"), PromptSetting("base", True, True, True)):
        kept = grow_and_compare(
            tokenizer, prompts_of(templates, setting, family), scenarios(shared_data_root, 10), rng, 8
        )
        assert kept.stats.spliced > 5 * kept.stats.full


def test_without_a_system_role_the_folded_prompt_is_kept_exactly(tokenizer, sample_root):
    folded = ChatTokenizer(tokenizer.tokenizer, system_role=False)
    prompt_of = prompts_of(load_templates(None), PromptSetting("base", True, False, True), "default")
    kept = grow_and_compare(folded, prompt_of, scenarios(sample_root, 6), random.Random(5), rounds=5)
    assert kept.stats.spliced > 0


class _NonLocal:
    """A tokenizer double whose first id counts the text's characters, so no tail can be kept: every
    splice differs from a full tokenization (pure logic; the real tokenizer is tested above)."""

    chat_template = None

    def apply_chat_template(self, messages, tokenize, add_generation_prompt, **template_variables):
        return "".join(m["content"] for m in messages)

    def __call__(self, texts, add_special_tokens, return_offsets_mapping=False):
        ids, spans = [], []
        for text in texts:
            ids.append([len(text)] + [ord(c) for c in text])
            spans.append([(0, 0)] + [(i, i + 1) for i in range(len(text))])
        return {"input_ids": ids, "offset_mapping": spans} if return_offsets_mapping else {"input_ids": ids}


def test_a_tokenizer_that_is_not_local_falls_back_to_whole_prompts_and_stays_exact():
    tokenizer = ChatTokenizer(_NonLocal(), system_role=True)
    kept = PromptIds(tokenizer, verify_first=10, verify_every=0)
    text = "hello world and more words"
    fulls = []
    for n in range(1, 7):
        messages = [{"role": "user", "content": text * n + " tail end"}]
        (ids,) = kept.ids([(("d", "user"), "user", messages)])
        assert ids == tokenizer.encode_chat(messages)
        fulls.append(kept.stats.full)
    assert kept.stats.mismatches == 1 and kept.stats.checked == kept.stats.spliced
    assert fulls[-1] - fulls[-3] == 2  # after the mismatch every prompt is tokenized whole


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("", ""),
        ("abc", "abd"),
        ("abc", "abc"),
        ("abc", "abcdef"),
        ("x" * 10_000, "x" * 9_000 + "y"),
        ("a" * 4096, "a" * 4097),
        ("y" + "x" * 9_000, "x" * 10_000),
        ("ab" * 5000, "b" + "ab" * 5000),
    ],
)
def test_common_prefix_and_suffix(a, b):
    expected = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    assert common_prefix(a, b) == expected == common_prefix(b, a)
    backwards = next((i for i, (x, y) in enumerate(zip(a[::-1], b[::-1])) if x != y), min(len(a), len(b)))
    assert common_suffix(a, b, len(a) + len(b)) == backwards == common_suffix(b, a, len(a) + len(b))
    assert common_suffix(a, b, 3) == min(backwards, 3)


def test_counting_from_the_tokenizer_files_equals_transformers_on_every_prompt(tokenizer, sample_root, tmp_path):
    """`personalens plan` counts with the tokenizer's files (no transformers, no torch): the same ids
    for every role's prompts, a grown dialogue's and the judge's, and the special tokens as written."""
    from personalens.engines.chat.template_files import TokenizerFiles, special_tokens
    from personalens.engines.models.embedded import embedded_model_dir
    from personalens.prompts.render import judge_messages

    files = ChatTokenizer.from_files(ModelConfig(name="SmolLM2-135M-Instruct"))
    templates = load_templates(TEMPLATE_SETS["official"]["folder"], style="official", verbatim=True)
    rng = random.Random(7)
    conversations = []
    for scenario in scenarios(sample_root, 6):
        turns = [Turn("user" if i % 2 == 0 else "assistant", reply(rng)) for i in range(5)]
        conversations += [
            user_agent_messages(templates, scenario, []),
            user_agent_messages(templates, scenario, turns[:4]),
            assistant_messages(templates, scenario, turns, PromptSetting("base", True, True, True), "llama"),
            judge_messages(templates, "naturalness", scenario, turns[:4], speaker="user"),
        ]
    assert files.encode_chats(conversations) == tokenizer.encode_chats(conversations)
    # a template that writes the tokenizer's own BOS (Llama 3's): rendered as transformers renders it
    (tmp_path / "tokenizer_config.json").write_text(
        '{"bos_token": {"content": "<|im_start|>"}, "eos_token": "<|im_end|>"}'
    )
    (tmp_path / "chat_template.jinja").write_text(
        "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    (tmp_path / "tokenizer.json").write_bytes((embedded_model_dir() / "tokenizer.json").read_bytes())
    assert special_tokens(tmp_path) == {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}
    assert (
        TokenizerFiles(tmp_path).apply_chat_template([{"role": "user", "content": "x"}], False, True) == "<|im_start|>x"
    )


@pytest.mark.parametrize("fidelity", sorted(TEMPLATE_SETS))
def test_plan_counts_what_prompts_share_and_what_the_next_prompt_repeats(tokenizer, sample_root, fidelity):
    """`plan`'s counts (plan/prompt_tokens.py) for the engine model's prefix cache: a role's prompts
    begin with `shared` tokens that another dialogue of the same user begins with too, and the next
    prompt of a role repeats all of its previous prompt but its `tail`, whatever the replies said
    (they are counted with a fixed exchange, checked here with random ones)."""
    from personalens.plan.prompt_tokens import count_prompts

    templates, setting = template_set(fidelity), SETTINGS[0]
    found = load_scenarios(sample_root)
    mine = [s for s in found if s.user.user_id == found[0].user.user_id][:3] + [found[-1]]
    rows = count_prompts(mine, templates, setting, "default", {"user_agent": tokenizer, "assistant": tokenizer}, [])
    first = tokenizer.encode_chats([user_agent_messages(templates, s, []) for s in mine])
    a, b = first[0], first[1]  # two dialogues of one user
    assert (
        0 < rows[0].shared["user"] < min(len(a), len(b)) and a[: rows[0].shared["user"]] == b[: rows[0].shared["user"]]
    )
    assert a[rows[0].shared["user"]] != b[rows[0].shared["user"]]
    assert rows[-1].shared["user"] > 0  # alone in the sample: counted against its user given another task
    rng = random.Random(fidelity)
    for s, row in zip(mine, rows):
        said = [Turn(("user", "assistant")[k % 2], reply(rng) or "ok") for k in range(4)]
        ids = tokenizer.encode_chats([user_agent_messages(templates, s, said[:k]) for k in (0, 2, 4)])
        for before, after, tail in ((ids[0], ids[1], row.tail["user_first"]), (ids[1], ids[2], row.tail["user"])):
            assert 0 <= tail < len(before) and before[: len(before) - tail] == after[: len(before) - tail]
        asked = tokenizer.encode_chats([assistant_messages(templates, s, said[:k], setting, "default") for k in (1, 3)])
        kept = len(asked[0]) - row.tail["assistant"]
        assert asked[0][:kept] == asked[1][:kept]
    if fidelity == "official":  # the user agent's instructions follow the conversation
        assert all(row.tail["user"] > 100 for row in rows)
