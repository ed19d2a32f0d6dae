"""No thinking reaches another party or the judge: scripted reasoning engines (every thinking form,
split by the same functions the real engines use, engines/chat/reasoning.py) through the `generate`,
`judge` and `report` commands; the thinking is stored and counted, a reply cut inside its thinking
ends its dialogue, and the report's leak check finds 0 markers (and finds them when an engine does
not split). tests/test_reasoning_vllm.py runs a real reasoning family's template through real vLLM."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import re
from pathlib import Path

from cli_helpers import read_rows
from test_fidelity import PromptRecorder, config

from personalens.config import run as R
from personalens.engines.chat.reasoning import MARKERS, THINKING, load_parser, split_ids, split_text, with_split
from personalens.engines.chat.spans import SPAN, thinking_found
from personalens.judge import command as judge_command
from personalens.report import command as report_command
from personalens.report.user_prompts import prompt_texts
from personalens.simulate import command as simulate_command


class _Words:
    """A tokenizer of whole words, growing its vocabulary (for vLLM's deepseek_r1 parser)."""

    def __init__(self):
        self.words = ["<think>", "</think>"]

    def get_vocab(self):
        return {w: i for i, w in enumerate(self.words)}

    def encode(self, text):
        for w in text.split():
            if w not in self.words:
                self.words.append(w)
        return [self.words.index(w) for w in text.split()]

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(self.words[i] for i in ids)


class Thinker(PromptRecorder):
    """Replies of reasoning models: the user agent's in Mistral's [THINK] form (split from the text),
    the assistant's in the `</think>`-only form of a template that opens <think> in the prompt (split on
    ids by vLLM's deepseek_r1 parser), the judge's in <think> blocks. The assistant of the task whose
    intent is `cut` stops inside its thinking at its second reply; so does every naturalness judgment
    (every other one after its thinking ended, cut before a word of answer: no reply either).
    `split=False`: an engine that hands the raw text on (the leak check must find it); `leak=True`: one
    that splits, but whose user agent is given the assistant's last thought and says it (no marker:
    the leak check by content must find it). Each thought is longer than a run the content check
    compares, so that one sent on would be found."""

    def __init__(self, cut: str = "", split: bool = True, leak: bool = False):
        super().__init__()
        self.cut, self.split, self.leak, self.n = cut, split, leak, 0
        self.thoughts: dict[str, str] = {}  # the assistant's thought per tag of its answer
        self.words = _Words()
        self.parser = load_parser("deepseek_r1", self.words, {})

    def generate(self, requests, on_finished=None):
        out = []
        for request, gen in zip(requests, super().generate(requests, on_finished)):
            self.n += 1
            # one word, which no two thoughts share a run of (engines/chat/spans.py) of
            thought = f"secret-thought-{self.n}-{hashlib.sha256(str(self.n).encode()).hexdigest()[:48]}"
            prompt = "".join(m["content"] for m in request.messages)
            if request.grammar:
                cut = "Naturalness" in request.grammar
                raw = f"<think>{thought} weighing" if cut else f"<think>{thought}</think>{gen.text}"
                if cut and self.n % 2:  # its thinking ended, then max_tokens before a word of answer
                    raw = f"<think>{thought}</think>\n"
                gen = dataclasses.replace(gen, finish_reason="length" if cut else "stop", completion_tokens=20)
                out.append(self._text(gen, raw))
            elif request.messages[-1]["content"].startswith("<user_profile>"):  # the user agent
                # the task to cut tags its user's replies, so that its assistant prompts can tell it
                answer = f"{gen.text} (about {self.cut})" if self.cut and self.cut in prompt else gen.text
                tags = re.findall(r"\[a\d+\]", prompt)
                if self.leak and tags:
                    answer = f"You thought {self.thoughts[tags[-1]]}. {answer}"
                gen = dataclasses.replace(gen, finish_reason="stop")
                out.append(self._text(gen, f"[THINK]{thought}[/THINK]{answer}"))
            else:
                replies = request.messages[-1]["content"].count("Assistant:")  # its history, as text
                stop = bool(self.cut) and self.cut in prompt and replies >= 1
                tag = f"[a{self.n}]"  # shorter than a run the content check compares
                self.thoughts[tag] = thought
                answer = f"{gen.text} {tag}" if self.leak else gen.text
                raw = f"{thought} and more" if stop else f"{thought} done </think> {answer}"
                out.append(self._ids(gen, raw, "length" if stop else "stop"))
        return out

    def _text(self, gen, raw):
        return with_split(gen, split_text(raw)) if self.split else dataclasses.replace(gen, text=raw)

    def _ids(self, gen, raw, finish):
        ids = self.words.encode(raw)
        gen = dataclasses.replace(gen, completion_tokens=len(ids), finish_reason=finish)
        if not self.split:
            return dataclasses.replace(gen, text=raw)
        return with_split(gen, split_ids(self.parser, ids, self.words.decode, opened=True))


def csv_rows(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def _sent(engine: PromptRecorder) -> list[str]:
    return ["".join(m["content"] for m in r.messages) for r in engine.requests]


def test_thinking_is_stored_counted_and_never_sent_on(tmp_path):
    out = tmp_path / "run"
    cfg = config(f"run.out_dir={out}")
    scenarios = R.scenarios(cfg)
    cut_task, cut_intent = scenarios[0].task.task_id, scenarios[0].task.user_intent
    engine = Thinker(cut=cut_intent)
    assert simulate_command.generate(cfg, lambda: {"user_agent": engine, "assistant": engine}) == 0
    # no prompt of the user agent or the assistant holds a thought or a marker
    sent = _sent(engine)
    assert not [t for t in sent if "secret-thought" in t or any(m in t for m in MARKERS)]
    dialogues = {d["task_id"]: d for d in read_rows(out / "dialogues")}
    cut = dialogues[cut_task]
    assert cut["ended"] == "thinking" and "assistant's reply stopped inside its thinking" in cut["error"]
    assert [t["role"] for t in cut["turns"]] == ["user", "assistant", "user"]  # the stopped reply is no turn
    turns = [t for d in dialogues.values() for t in d["turns"]]
    assert all(t["reasoning"].startswith("secret-thought-") for t in turns)
    assert all("secret-thought" not in t["text"] and not any(m in t["text"] for m in MARKERS) for t in turns)
    # the assistant's thinking counted on ids (the thought, "done" and </think>); the user agent's seen as text
    assert {t["reasoning_tokens"] for t in turns if t["role"] == "assistant"} == {3}
    assert {t["reasoning_tokens"] for t in turns if t["role"] == "user"} == {None}

    judge = Thinker()
    assert judge_command.judge(cfg, lambda: {"judge": judge}) == 0
    assert not [t for t in _sent(judge) if "secret-thought" in t or any(m in t for m in MARKERS)]
    judgments = read_rows(out / "judgments")
    assert cut_task in {j["task_id"] for j in judgments}  # judged on the turns it had, as on context
    for j in judgments:
        assert j["judge_reasoning"].startswith("secret-thought-")
        if j["dimension"] == "naturalness":
            assert (j["parsed"], j["finish_reason"]) == (False, THINKING)
            assert j["failure"] == "stopped inside its thinking at 20 tokens"
        else:
            assert j["parsed"] and "secret-thought" not in j["judge_text"]

    assert report_command.report(cfg) == 0
    report = out / "report"
    rows = {r["role"]: r for r in csv_rows(report / "thinking.csv")}
    assistant_turns = [t for d in dialogues.values() for t in d["turns"] if t["role"] == "assistant"]
    assert int(rows["assistant"]["thinking_tokens"]) == 3 * len(assistant_turns)
    assert int(rows["assistant"]["stopped"]) == 1 and int(rows["assistant"]["replies"]) == len(assistant_turns) + 1
    assert int(rows["user agent"]["not_counted"]) == sum(t["role"] == "user" for t in turns)
    assert int(rows["judge"]["stopped"]) == sum(j["dimension"] == "naturalness" for j in judgments)
    assert {rows[r][c] for r in ("user agent", "assistant") for c in ("leaks", "found")} == {"0"}
    assert sum(int(r["thinking"]) for r in csv_rows(report / "endings.csv")) == 1
    text = (report / "report.md").read_text()
    assert "**Leak check: 0 thinking markers**" in text and "1 on a reply stopped inside its thinking" in text
    assert "**0 thinking found in what was sent on**" in text
    # the reply cut in its thinking is kept on record, with no answer, and read per model in the report
    stopped = cut["stopped_turn"]
    assert (stopped["role"], stopped["text"], stopped["finish_reason"]) == ("assistant", "", THINKING)
    assert stopped["reasoning"].startswith("secret-thought-") and stopped["completion_tokens"] == 3
    assert all(d["stopped_turn"] is None for d in dialogues.values() if d["ended"] != "thinking")
    [row] = csv_rows(report / "stopped_thinking.csv")
    assert (row["role"], row["stopped"], row["thinking_most"]) == ("assistant", "1", "3")
    assert row["model"] == cut["assistant_model"] and int(row["dialogues"]) == len(dialogues)
    assert "Replies stopped inside their thinking, per model" in text


def _run(out: Path, engine: Thinker) -> None:
    """generate with `engine` as both parties, judge with a splitting Thinker, report."""
    cfg = config(f"run.out_dir={out}")
    assert simulate_command.generate(cfg, lambda: {"user_agent": engine, "assistant": engine}) == 0
    assert judge_command.judge(cfg, lambda: {"judge": Thinker()}) == 0
    assert report_command.report(cfg) == 0


def test_the_leak_check_finds_thinking_an_engine_did_not_split(tmp_path):
    out = tmp_path / "run"
    _run(out, Thinker(split=False))
    turns = [t for d in read_rows(out / "dialogues") for t in d["turns"]]
    markers = sum(t["text"].count(m) for t in turns for m in MARKERS)
    assert markers >= len(turns)  # every raw reply holds [THINK]..[/THINK] or </think>
    text = (out / "report" / "report.md").read_text()
    assert f"**Leak check: {markers} thinking markers**" in text


def test_the_leak_check_finds_thinking_by_its_content(tmp_path, capsys):
    """Thinking split and stored as it should be, then said by the other party with no marker: the
    markers read 0, the content check finds every assistant thought a user reply repeated, and the
    count is printed beside Table 3."""
    out = tmp_path / "run"
    _run(out, Thinker(leak=True))
    dialogues = read_rows(out / "dialogues")
    repeated = 0
    for d in dialogues:
        texts = [t["text"] for t in d["turns"]]
        repeated += sum(
            t["role"] == "assistant" and any(t["reasoning"].split()[0] in later for later in texts[i + 1 :])
            for i, t in enumerate(d["turns"])
        )
    assert repeated >= len(dialogues)  # every dialogue's user agent answered an assistant reply at least once
    rows = {r["role"]: r for r in csv_rows(out / "report" / "thinking.csv")}
    assert (rows["assistant"]["found"], rows["user agent"]["found"]) == (str(repeated), "0")
    assert {rows[r]["leaks"] for r in ("user agent", "assistant")} == {"0"}
    text = (out / "report" / "report.md").read_text()
    assert f"**Leak check: 0 thinking markers** in the texts sent to another party, and **{repeated} thinking" in text
    assert f"Leak check: 0 thinking markers sent on, {repeated} thinking found in what was sent on" in (
        capsys.readouterr().out
    )


class Quoting(Thinker):
    """A Thinker whose user agent thinks about a line of its profile in every reply and says it from its
    second reply on (as a user agent speaks from its profile), which its assistant then repeats; with
    `plant`, an assistant whose answer also repeats its own thought (a leak into the reply itself)."""

    def __init__(self, out: Path, plant: bool = False):
        super().__init__()
        self.out, self.plant, self.quoted = out, plant, set()

    def generate(self, requests, on_finished=None):
        given = "\n".join(prompt_texts(self.out).values())
        out = []
        for request, gen in zip(requests, super().generate(requests, on_finished)):
            prompt = "\n".join(m["content"] for m in request.messages)
            if prompt.startswith("<user_profile>") or request.messages[-1]["content"].startswith("<user_profile>"):
                line = max((s for s in prompt.split("\n") if len(s) >= 2 * SPAN and s in given), key=len)
                self.quoted.add(line)
                # thought at the opening, said in the next reply
                said = f"{line}. " if "[ASSISTANT]" in request.messages[-1]["content"] else ""
                gen = dataclasses.replace(gen, text=f"{said}{gen.text}", reasoning=f"It says: {line}. {gen.reasoning}")
            elif not request.grammar:
                said = [q for q in self.quoted if q in prompt]
                tail = f" {gen.reasoning}" if self.plant else ""
                gen = dataclasses.replace(gen, text=f"{gen.text} {' '.join(said)}{tail}")
            out.append(gen)
        return out


def test_the_leak_check_ignores_the_profile_that_thinking_quotes_and_finds_thinking_in_its_own_reply(tmp_path):
    """A clean run whose user agent's thinking quotes its profile line, which both parties then say:
    0 found. The same with every assistant reply repeating its own thought: each such reply is found."""
    out = tmp_path / "run"
    quoting = Quoting(out)
    _run(out, quoting)
    assert quoting.quoted  # profile lines were thought and said
    turns = [t for d in read_rows(out / "dialogues") for t in d["turns"]]
    assert any(q in t["text"] and q in t["reasoning"] for t in turns for q in quoting.quoted)
    # without what its prompt showed it, the opening's thought would count as found when said later
    unshown = [thinking_found([(t["text"], t["reasoning"]) for t in d["turns"]]) for d in read_rows(out / "dialogues")]
    assert sum(found[0] for found in unshown) > 0
    rows = {r["role"]: r for r in csv_rows(out / "report" / "thinking.csv")}
    assert (rows["user agent"]["found"], rows["assistant"]["found"]) == ("0", "0")
    assert "and **0 thinking found in what was sent on**" in (out / "report" / "report.md").read_text()

    planted = tmp_path / "planted"
    _run(planted, Quoting(planted, plant=True))
    answers = [t for d in read_rows(planted / "dialogues") for t in d["turns"] if t["role"] == "assistant"]
    rows = {r["role"]: r for r in csv_rows(planted / "report" / "thinking.csv")}
    assert (rows["user agent"]["found"], rows["assistant"]["found"]) == ("0", str(len(answers)))
