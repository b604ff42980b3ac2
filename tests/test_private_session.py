"""A session is private: 0700/0600 throughout, no secret-carrying JFR events unless asked (docs/session.md)."""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import default_java_home
from test_record_helpers import compile_workload, jdk_env, jfr_event_counts, only_jvm_dir, read_json, run_tandem, tandem_argv

# java-agent PauseEvents.SECRET_CARRYING: the types a JDK 17 default recording holds of them.
SECRET_TYPES = ("jdk.InitialEnvironmentVariable", "jdk.InitialSystemProperty", "jdk.JVMInformation", "jdk.SystemProcess")
SECRET_VALUE = "tandem-test-secret-3f9a1c"


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> Path:
    return compile_workload(tmp_path_factory.mktemp("workload"))


def readable_by_others(session: Path) -> list[str]:
    """Every path under SESSION (itself included) with a group or other permission bit."""
    found = []
    for path in [session, *session.rglob("*")]:
        mode = os.lstat(path).st_mode
        if mode & 0o077:
            found.append(f"{stat.filemode(mode)} {path.relative_to(session.parent)}")
    return found


def secrets_env() -> dict[str, str]:
    # umask 022: what most services run with; the session must be private anyway.
    return jdk_env(default_java_home(), TANDEM_TEST_TOKEN=SECRET_VALUE)


def test_record_session_is_private_and_holds_no_secrets(tmp_path):
    session = tmp_path / "s"
    env = secrets_env()
    run = run_tandem("record", "-o", str(session), "--", sys.executable, "-m", "engine.demo.workload", "--seconds", "2",
                     env=env, timeout=180, preexec_fn=lambda: os.umask(0o022))
    assert run.returncode == 0, run.stderr
    assert readable_by_others(session) == []
    jvm_dir = only_jvm_dir(session)
    assert list(session.glob("py-*"))
    counts = jfr_event_counts(default_java_home(), jvm_dir / "recording.jfr")
    assert counts.get("jdk.SafepointBegin", 0) > 0
    assert {t: counts.get(t, 0) for t in SECRET_TYPES} == {t: 0 for t in SECRET_TYPES}
    assert SECRET_VALUE.encode() not in (jvm_dir / "recording.jfr").read_bytes()
    assert read_json(jvm_dir / "jvm.json")["secret_events"] is False

    # Analysis outputs copy nothing secret either.
    out = tmp_path / "out"
    run = run_tandem("analyze", str(session), "-o", str(out), env=env, timeout=180)
    assert run.returncode == 0, run.stderr
    assert all(SECRET_VALUE.encode() not in f.read_bytes() for f in out.rglob("*") if f.is_file())


def test_the_option_brings_secret_events_back(workload, tmp_path):
    session = tmp_path / "s"
    run = run_tandem("record", "-o", str(session), "--secret-events", "--", "java", "-cp", str(workload), "Workload", "alloc", "0.5",
                     env=secrets_env())
    assert run.returncode == 0, run.stderr
    jvm_dir = only_jvm_dir(session)
    counts = jfr_event_counts(default_java_home(), jvm_dir / "recording.jfr")
    assert counts.get("jdk.InitialEnvironmentVariable", 0) > 0 and counts.get("jdk.InitialSystemProperty", 0) > 0
    assert SECRET_VALUE.encode() in (jvm_dir / "recording.jfr").read_bytes()
    assert readable_by_others(session) == []
    # One named type without the whole set: `--event NAME` wins over the default.
    one = tmp_path / "one"
    run = run_tandem("record", "-o", str(one), "--event", "jdk.InitialSystemProperty", "--", "java", "-cp", str(workload),
                     "Workload", "alloc", "0.5", env=secrets_env())
    assert run.returncode == 0, run.stderr
    counts = jfr_event_counts(default_java_home(), only_jvm_dir(one) / "recording.jfr")
    assert counts.get("jdk.InitialSystemProperty", 0) > 0 and counts.get("jdk.InitialEnvironmentVariable", 0) == 0


def test_attach_session_is_private(workload, tmp_path):
    env = secrets_env()
    target = subprocess.Popen(["java", "-cp", str(workload), "Workload", "wait"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=lambda: os.umask(0o022))
    try:
        assert target.stdout.readline().strip() == "ready"
        session = tmp_path / "s"
        run = run_tandem("attach", str(target.pid), "-o", str(session), "--duration", "1.5", env=env)
        assert run.returncode == 0, run.stderr
        assert readable_by_others(session) == []
        counts = jfr_event_counts(default_java_home(), session / f"jvm-{target.pid}" / "recording.jfr")
        assert {t: counts.get(t, 0) for t in SECRET_TYPES} == {t: 0 for t in SECRET_TYPES}
    finally:
        target.kill()
        target.wait()


@pytest.mark.slow
def test_live_session_is_private(tmp_path):
    session = tmp_path / "s"
    proc = subprocess.run([*tandem_argv("live", "--session", str(session), "--roll", "1s", "--"), sys.executable, "-m",
                           "engine.demo.workload", "--seconds", "3"], env=secrets_env(), capture_output=True, text=True,
                          timeout=240, preexec_fn=lambda: os.umask(0o022))
    assert proc.returncode == 0, proc.stderr
    assert list((session / "live").glob("part-*"))
    assert readable_by_others(session) == []
    counts = jfr_event_counts(default_java_home(), only_jvm_dir(session) / "recording.jfr")
    assert {t: counts.get(t, 0) for t in SECRET_TYPES} == {t: 0 for t in SECRET_TYPES}


def test_a_planted_link_or_foreign_directory_is_refused(workload, tmp_path):
    env = secrets_env()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "link"
    link.symlink_to(elsewhere)
    run = run_tandem("record", "-o", str(link), "--", "true", env=env)
    assert run.returncode == 2 and "not a directory (a symbolic link?)" in run.stderr, run.stderr
    assert list(elsewhere.iterdir()) == []

    if os.geteuid() == 0:
        foreign = tmp_path / "foreign"
        foreign.mkdir(mode=0o777)
        os.chown(foreign, 65534, 65534)
        run = run_tandem("record", "-o", str(foreign), "--", "true", env=env)
        assert run.returncode == 2 and "belongs to another user" in run.stderr, run.stderr

    # The agent's own directory: a link planted at jvm-<pid> is not followed; the JVM runs on.
    session = tmp_path / "s"
    session.mkdir(mode=0o700)
    target = subprocess.Popen(["java", "-cp", str(workload), "Workload", "wait"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert target.stdout.readline().strip() == "ready"
        (session / f"jvm-{target.pid}").symlink_to(elsewhere)
        from engine import jvm
        from engine.record.attach import load_agent
        from engine.record.launch import agent_options

        load_agent(default_java_home() / "bin" / "java", jvm.agent_jar(), target.pid, agent_options(session))
        target.send_signal(signal.SIGTERM)
        _, err = target.communicate(timeout=60)
        assert "refusing to write into it" in err
        assert list(elsewhere.iterdir()) == []
    finally:
        target.send_signal(signal.SIGKILL)
        target.wait()


def test_probe_directory_refuses_a_planted_link(tmp_path):
    from engine.errors import TandemError
    from engine.probe.private import private_directory

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "py-1").symlink_to(elsewhere)
    with pytest.raises(TandemError, match="symbolic link"):
        private_directory(tmp_path / "py-1")
    made = private_directory(tmp_path / "py-2")
    assert stat.S_IMODE(os.lstat(made).st_mode) == 0o700
