"""A scripted multi-turn search rollout through the real session code: a host policy (policy_logits_fn) writes
<search>/<answer> turns with the real SmolLM2 tokenizer, decoding halts at each tag, the host appends an
<information> block and decoding resumes; the transcript must come out exactly. Every program the session runs
runs inside `runtime.returning_large_blocks` (a rollout's blocks go back to the OS)."""

import contextlib

from searchjax import generation

STOPS = ("</search>", "</answer>")


def test_scripted_search_rollout(smollm2_tokenizer, monkeypatch):
    tok = smollm2_tokenizer
    depth, entered, policy_depths = [0], [], []

    @contextlib.contextmanager
    def recording_block():
        entered.append(True)
        depth[0] += 1
        try:
            yield True  # as in a process that keeps freed memory: the caller blocks on its programs inside
        finally:
            depth[0] -= 1

    monkeypatch.setattr(generation.runtime, "returning_large_blocks", recording_block)
    info = lambda text: tok.encode(f"\n\n<information>{text}</information>\n\n")
    # Per row: alternating (generated text, appended block) segments.
    scripts = [
        ["<think>need a lookup</think>\n<search>capital of France</search>", info("Doc 1(Title: Paris) Paris is"),
         "<answer>Paris</answer>"],
        ["<answer>42</answer>"],
        ["<search>first</search>", info("Doc 1(Title: A) a"), "ok <search>second</search>",
         info("Doc 1(Title: B) b"), "<answer>B</answer>"],
    ]
    prompts = [tok.encode(f"Question {i}:") for i in range(3)]
    transcripts = []
    for prompt, script in zip(prompts, scripts):
        transcripts.append(list(prompt) + [t for s in script for t in (tok.encode(s) if isinstance(s, str) else s)])
    eos = tok.eos_token_ids[0]

    def next_token(row, tokens):
        if row >= len(transcripts) or len(tokens) >= len(transcripts[row]):
            return eos
        assert tokens == transcripts[row][:len(tokens)]  # the policy sees exactly what was generated and appended
        policy_depths.append(depth[0])
        return transcripts[row][len(tokens)]

    fn = generation.policy_logits_fn(next_token, tok.vocab_size)
    session = generation.start(None, None, prompts, max_cache_len=256, tokenizer=tok, logits_fn=fn)
    reasons = []
    for turn in range(3):
        session, results = generation.decode(session, 40, temperature=1.0, stop=STOPS)  # sampled: still forced
        reasons.append([r.stop_reason for r in results])
        for row, result in enumerate(results):
            expected = scripts[row][2 * turn] if 2 * turn < len(scripts[row]) else None
            assert result.token_ids == ([] if expected is None else tok.encode(expected)), (turn, row)
            assert all(lp > -1e-3 for lp in result.logprobs)
        blocks = [scripts[row][2 * turn + 1] if 2 * turn + 1 < len(scripts[row]) else [] for row in range(3)]
        if turn < 2:
            session = generation.append(session, blocks)
    assert reasons == [["stop"] * 3, ["stop", "stop", "stop"], ["stop", "stop", "stop"]]
    assert generation.sequences(session) == transcripts
    assert len(entered) == 1 + 3 + 2  # start, each decode, each append
    assert policy_depths and set(policy_depths) == {1}  # the programs ran inside the block, never after it
