"""The judge start-up probe (searchjax.experiment.validate.probe_judge) against real loopback servers: a judge that
answers passes with one request sent; a dead URL, a 401 and a wrong model name (404) stop the run with one line
naming the config section, before any model loads."""

import pathlib

import pytest

from searchjax.config_files import sibling
from searchjax.experiment.validate import probe_judge
from searchjax.judges.testing_server import ScriptedReply, dead_endpoint_url, serve_scripted


def _section(base_url):
    configs = pathlib.Path(__file__).resolve().parents[2] / "configs" / "eviback.py"
    section = sibling(str(configs), "eviback").teacher_section("openai_compat")
    section.base_url, section.api_key_env, section.max_attempts, section.backoff_initial_s = base_url, "", 1, 0.01
    return section


def test_a_judge_that_answers_passes_the_probe():
    with serve_scripted(lambda body: "OK") as server:
        probe_judge(_section(server.base_url), "teacher")
        bodies = server.request_bodies()
    assert len(bodies) == 1 and bodies[0]["model"] == "teacher" and bodies[0]["max_tokens"] == 1


@pytest.mark.parametrize("status", [401, 404])
def test_a_refusing_judge_stops_the_run_at_start_up(status):
    with serve_scripted(lambda body: ScriptedReply(content=None, status=status)) as server:
        with pytest.raises(ValueError, match=r"^config\.teacher: ") as error:
            probe_judge(_section(server.base_url), "teacher")
    assert "\n" not in str(error.value)


def test_a_dead_judge_url_stops_the_run_at_start_up():
    with pytest.raises(ValueError, match=r"^config\.teacher: "):
        probe_judge(_section(dead_endpoint_url()), "teacher")
