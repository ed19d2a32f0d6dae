"""Synthetic judged runs whose scores are clustered by user, for the seeded simulation tests of the
intervals and comparisons (tests/test_intervals.py, tests/test_compare_stats.py), and written as a
run directory for bench/intervals.py:

    python tests/synthetic_runs.py runs/synthetic50 --users 50
    python tests/synthetic_runs.py runs/raised50 --users 50 --raised   # P +0.45, all else the same

Every user has 20-60 scenarios (the release has about 80 per user); a user's scores share a
user-level effect, as dialogues built from one profile do. The written run's parameters: TC with a
completion probability per user ~ Beta(3, 2) (intra-user correlation 0.17); P the rounded latent
2.6 + N(0, 0.4) per user + N(0, 0.8) per scenario; naturalness and coherence 4.0 + N(0, 0.35) per
user + N(0, 0.6) per scenario; rounds Poisson with a mean per user in 2-6; reply lengths N(mean per
user in 30-70, 25) tokens. The draws are numpy arrays, vectorized,
so that 200 seeded draws take well under a second to make."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

SCENARIOS_PER_USER = (20, 60)


def user_sizes(rng: np.random.Generator, users: int) -> np.ndarray:
    return rng.integers(SCENARIOS_PER_USER[0], SCENARIOS_PER_USER[1] + 1, size=users)


def user_of_scenarios(sizes: np.ndarray) -> np.ndarray:
    """The user index of each scenario, users in order."""
    return np.repeat(np.arange(sizes.size), sizes)


def completion(rng: np.random.Generator, users: int, a: float = 3.0, b: float = 2.0) -> tuple[np.ndarray, np.ndarray]:
    """(TC in {0, 1}, user per scenario): user u completes with probability p_u ~ Beta(a, b), so the
    population's completion rate is a / (a + b) exactly."""
    owner = user_of_scenarios(user_sizes(rng, users))
    p = rng.beta(a, b, size=users)
    return (rng.random(owner.size) < p[owner]).astype(float), owner


def personalization(rng: np.random.Generator, owner: np.ndarray, base: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """P on its 1-4 scale: a user's latent level `base[u] + shift[u]` plus scenario noise, rounded."""
    latent = base[owner] + shift[owner] + rng.normal(0.0, 0.8, size=owner.size)
    return np.clip(np.rint(latent), 1, 4)


def aa_pair(rng: np.random.Generator, users: int, tau: float = 0.3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(P of run A, P of run B, user per scenario) for two runs drawn from one distribution: each run
    has its own effect per user (N(0, tau)), so the difference is clustered by user with mean 0."""
    owner = user_of_scenarios(user_sizes(rng, users))
    base = rng.normal(2.5, 0.5, size=users)
    a = personalization(rng, owner, base, rng.normal(0.0, tau, size=users))
    b = personalization(rng, owner, base, rng.normal(0.0, tau, size=users))
    return a, b, owner


def better_pair(
    rng: np.random.Generator, users: int, delta: float, spread: float = 0.1
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(P of run A, P of run B, user per scenario) where B is better for every user: a scenario's P
    rises by one point with probability p_u ~ Uniform(delta - spread, delta + spread) (A's P is at
    most 3, so B stays on the scale); the true mean difference is `delta`."""
    owner = user_of_scenarios(user_sizes(rng, users))
    base = rng.normal(2.2, 0.4, size=users)
    a = np.minimum(personalization(rng, owner, base, np.zeros(users)), 3.0)
    p = rng.uniform(delta - spread, delta + spread, size=users)
    return a, a + (rng.random(owner.size) < p[owner]), owner


def write_run(out: Path, users: int, seed: int = 0, raised: bool = False) -> Path:
    """A judged run directory (dialogues and judgments in the store's schemas) with the six
    whole-dialogue judgments per scenario, 80% single-domain, scores clustered by user. With
    `raised`, P is one point higher (at most 4) on every other scenario of each user and all else
    is the same as without: two runs of one seed then differ by about +0.45 on P alone."""
    from run_rows import dialogue_row, judgment_row
    from test_report import write_run as write_parts

    rng = np.random.default_rng(seed)
    tc, owner = completion(rng, users)
    base = rng.normal(2.6, 0.4, size=users)
    p = personalization(rng, owner, base, np.zeros(users))
    if raised:
        first = np.searchsorted(owner, owner)  # each scenario's user's first scenario
        p = np.where((np.arange(owner.size) - first) % 2 == 0, np.minimum(p + 1, 4), p)
    other = {
        (dim, speaker): np.clip(
            np.rint(rng.normal(4.0, 0.35, size=users)[owner] + rng.normal(0, 0.6, owner.size)), 1, 5
        )
        for dim in ("naturalness", "coherence")
        for speaker in ("assistant", "user")
    }
    rounds = np.maximum(1, rng.poisson(rng.uniform(2.0, 6.0, size=users)[owner]))
    tokens = rng.uniform(30.0, 70.0, size=users)  # a user's mean reply length
    dialogues, judgments = [], []
    for i, u in enumerate(owner):
        kind = "SD" if rng.random() < 0.8 else "MD"
        domains = ["Movies"] if kind == "SD" else ["Movies", "Books"]
        turns = [
            {
                "role": role,
                "text": "...",
                "prompt_tokens": 5,
                "completion_tokens": max(1, int(rng.normal(tokens[u], 25))),
            }
            for _ in range(int(rounds[i]))
            for role in ("user", "assistant")
        ]
        d = dialogue_row(f"user{u}", f"{kind}-task-{i}", kind, domains, seed=i, turns=turns, model="synthetic")
        dialogues.append(d)
        judgments += [judgment_row(d, "task_completion", float(tc[i])), judgment_row(d, "personalization", float(p[i]))]
        judgments += [judgment_row(d, dim, float(v[i]), speaker=spk) for (dim, spk), v in other.items()]
    return write_parts(out, dialogues, judgments, shards=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--raised", action="store_true", help="P one point higher on every other scenario of a user")
    args = parser.parse_args()
    print(write_run(args.out, args.users, args.seed, args.raised))


if __name__ == "__main__":
    main()
