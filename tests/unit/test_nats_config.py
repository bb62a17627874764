"""The messaging layer's configuration (pure: no server): NATS streams of different plans never collide by
accident (issue 46 §3.1), the inbox prefix (§3.6), and where credentials and TLS files are named (§3.5)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from _conf import edit_yaml
from tandem import cli
from tandem.config import load_cluster, load_plan, load_plans, load_plans_and_errors
from tandem.errors import ConfigError


@pytest.fixture
def plans(conf: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The shipped conf/, and ``alerts``: a copy of ``hot_rooms`` whose output publishes to no stream."""
    monkeypatch.delenv("TANDEM_NATS_URL", raising=False)
    monkeypatch.setenv("TANDEM_CONF_DIR", str(conf))
    shutil.copy(conf / "plans" / "hot_rooms.yaml", conf / "plans" / "alerts.yaml")

    def as_alerts(plan: dict) -> None:
        plan["name"] = "alerts"
        del plan["outputs"]["hot_readings"]["stream"]
    edit_yaml(conf / "plans" / "alerts.yaml", as_alerts)
    return conf


def streams_of(conf: Path, plan: str, **settings: dict) -> None:
    """Set ``settings`` (stream name: its settings to update) in ``plan``'s file."""
    edit_yaml(conf / "plans" / f"{plan}.yaml", lambda declared: [declared["streams"][name].update(values)
                                                                 for name, values in settings.items()])


def test_the_shipped_plans_share_no_nats_stream(conf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TANDEM_NATS_URL", raising=False)
    loaded, broken = load_plans_and_errors(load_cluster(conf / "cluster.yaml"))
    assert not broken and "hot_rooms" in loaded


def test_a_plan_declaring_another_plans_output_stream_as_its_own_is_refused_naming_both(plans: Path) -> None:
    streams_of(plans, "alerts", temps={"from_plan": "hot_rooms"})
    loaded, broken = load_plans_and_errors(load_cluster(plans / "cluster.yaml"))
    assert "hot_rooms" in loaded, "the plan whose output publishes to the stream keeps it"
    error = broken["alerts"]
    assert isinstance(error, ConfigError)
    assert str(error).startswith(f"{plans / 'plans' / 'alerts.yaml'}: streams.hot: the NATS stream tandem_hot "
                                 f"(subjects tandem.hot.*) is declared by plan hot_rooms too "
                                 f"({plans / 'plans' / 'hot_rooms.yaml'}: streams.hot)")
    assert "from_plan: hot_rooms" in str(error)
    with pytest.raises(ConfigError, match=r"alerts\.yaml: streams\.hot: "):
        load_plans(load_cluster(plans / "cluster.yaml"))
    assert load_plan("alerts", load_cluster(plans / "cluster.yaml")), "one plan alone cannot see the others"


def test_two_plans_declaring_one_input_stream_are_both_refused(plans: Path) -> None:
    streams_of(plans, "alerts", hot={"from_plan": "hot_rooms"})  # temps: both plans' input
    _, broken = load_plans_and_errors(load_cluster(plans / "cluster.yaml"))
    assert set(broken) == {"alerts", "hot_rooms"}
    assert "hot_rooms.yaml: streams.temps: the NATS stream tandem_temps" in str(broken["hot_rooms"])
    assert "declared by plan alerts too" in str(broken["hot_rooms"])
    assert "declared by plan hot_rooms too" in str(broken["alerts"])


def test_a_plan_reads_another_plans_streams_on_purpose_with_from_plan(plans: Path) -> None:
    streams_of(plans, "alerts", hot={"from_plan": "hot_rooms"}, temps={"from_plan": "hot_rooms"})
    loaded, broken = load_plans_and_errors(load_cluster(plans / "cluster.yaml"))
    assert not broken
    alerts = loaded["alerts"]
    assert alerts.from_plan("hot") == "hot_rooms" and alerts.input_streams == [], "producers write to neither"
    assert loaded["hot_rooms"].input_streams == ["temps"]


@pytest.mark.parametrize(("settings", "problem"), [
    ({"partitions": 5}, r"alerts\.yaml: streams\.hot\.from_plan: must declare stream hot as plan hot_rooms does: "
                        r"partitions 5 here, 3 in .*hot_rooms\.yaml: streams\.hot\.partitions"),
    ({"retention": {"max_age": "1 day"}}, r"streams\.hot\.from_plan: must declare stream hot as plan hot_rooms "
                                          r"does: retention .* here, .* in .*hot_rooms\.yaml: streams\.hot\.retention"),
    ({"key": "room_no"}, r"key 'room_no' here, 'device_id' in .*hot_rooms\.yaml: streams\.hot\.key"),
    ({"fields": {"room_no": {"type": "long", "at_least": 0}, "device_id": {"type": "string", "from": "device"},
                 "temp": {"type": "double"}, "time": {"type": "epoch_millis"}}},
     r"key read from 'device' here, from 'device_id' in .*hot_rooms\.yaml: streams\.hot\.fields\.device_id\.from"),
])
def test_a_stream_read_from_another_plan_is_declared_as_that_plan_does(plans: Path, settings: dict,
                                                                       problem: str) -> None:
    streams_of(plans, "alerts", hot={"from_plan": "hot_rooms", **settings}, temps={"from_plan": "hot_rooms"})
    _, broken = load_plans_and_errors(load_cluster(plans / "cluster.yaml"))
    assert list(broken) == ["alerts"]
    with pytest.raises(ConfigError, match=problem):
        raise broken["alerts"]


@pytest.mark.parametrize(("plan_name", "problem"), [
    ("nowhere", r"alerts\.yaml: streams\.hot\.from_plan: no plan 'nowhere'"),
    ("trades", r"alerts\.yaml: streams\.hot\.from_plan: plan trades .*declares no nats stream 'hot'"),
])
def test_from_plan_names_a_plan_that_declares_the_stream(plans: Path, plan_name: str, problem: str) -> None:
    streams_of(plans, "alerts", hot={"from_plan": plan_name}, temps={"from_plan": "hot_rooms"})
    _, broken = load_plans_and_errors(load_cluster(plans / "cluster.yaml"))
    assert list(broken) == ["alerts"]
    with pytest.raises(ConfigError, match=problem):
        raise broken["alerts"]


def test_a_plan_never_publishes_to_or_names_itself_in_from_plan(plans: Path) -> None:
    cluster = load_cluster(plans / "cluster.yaml")
    streams_of(plans, "hot_rooms", hot={"from_plan": "alerts"})
    with pytest.raises(ConfigError, match=r"hot_rooms\.yaml: outputs\.hot_readings\.stream: stream 'hot' is plan "
                                          r"alerts's \(streams\.hot\.from_plan\): an output publishes to a stream of "
                                          r"its own plan"):
        load_plan("hot_rooms", cluster)
    streams_of(plans, "alerts", hot={"from_plan": "alerts"})
    with pytest.raises(ConfigError, match=r"alerts\.yaml: streams\.hot\.from_plan: names this plan"):
        load_plan("alerts", cluster)


def test_config_check_refuses_both_files_of_a_collision(plans: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["config", "check"]) == 2
    output = " ".join(capsys.readouterr().err.split())
    assert "alerts.yaml: streams.hot: the NATS stream tandem_hot" in output
    assert "hot_rooms.yaml: streams.temps: the NATS stream tandem_temps" in output


def test_the_inbox_prefix_is_a_subject_without_wildcards(conf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TANDEM_NATS_URL", raising=False)
    assert load_cluster(conf / "cluster.yaml").nats.inbox_prefix == "_INBOX"
    edit_yaml(conf / "cluster.yaml", lambda cluster: cluster["nats"].update(inbox_prefix="_I.tandem-relay"))
    assert load_cluster(conf / "cluster.yaml").nats.inbox_prefix == "_I.tandem-relay"
    monkeypatch.setenv("TANDEM_NATS_URL", "nats://127.0.0.1:4333")
    assert load_cluster(conf / "cluster.yaml").nats.inbox_prefix == "_I.tandem-relay", "the URL overrides servers only"
    monkeypatch.setenv("TANDEM_NATS_INBOX_PREFIX", "_INBOX_receiver")
    assert load_cluster(conf / "cluster.yaml").nats.inbox_prefix == "_INBOX_receiver", "this process's own"
    monkeypatch.setenv("TANDEM_NATS_INBOX_PREFIX", "_INBOX.*")
    with pytest.raises(ConfigError, match=r"TANDEM_NATS_INBOX_PREFIX \(environment\)"):
        load_cluster(conf / "cluster.yaml")
    monkeypatch.delenv("TANDEM_NATS_INBOX_PREFIX")
    for bad in ("_INBOX.>", "a b", "a..b", ""):
        edit_yaml(conf / "cluster.yaml", lambda cluster: cluster["nats"].update(inbox_prefix=bad))
        with pytest.raises(ConfigError, match=r"cluster\.yaml: nats\.inbox_prefix"):
            load_cluster(conf / "cluster.yaml")


def nats_section(conf: Path, **settings: object) -> None:
    edit_yaml(conf / "cluster.yaml", lambda cluster: cluster["nats"].update(settings))


def test_tls_files_and_credentials_are_files_named_in_cluster_yaml_or_the_environment(
        conf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("TANDEM_NATS_URL", "TANDEM_NATS_CREDS", "TANDEM_NATS_NKEY_SEED", "TANDEM_NATS_TLS_CA"):
        monkeypatch.delenv(variable, raising=False)
    nats_section(conf, servers=["tls://nats.example.com:4222"], nkey_seed_file="secrets/node.nk",
                 tls={"ca_file": "/etc/tandem/nats-ca.pem", "cert_file": "pki/node.pem", "key_file": "pki/node.key"})
    nats = load_cluster(conf / "cluster.yaml").nats
    assert (nats.nkey_seed_file, nats.creds_file) == (str(conf / "secrets" / "node.nk"), None), "relative: to conf/"
    assert (nats.tls_ca_file, nats.tls_cert_file, nats.tls_key_file) == (
        "/etc/tandem/nats-ca.pem", str(conf / "pki" / "node.pem"), str(conf / "pki" / "node.key"))
    assert nats.file_variables == {"TANDEM_NATS_TLS_CA": "/etc/tandem/nats-ca.pem",
                                   "TANDEM_NATS_TLS_CERT": str(conf / "pki" / "node.pem"),
                                   "TANDEM_NATS_TLS_KEY": str(conf / "pki" / "node.key"),
                                   "TANDEM_NATS_NKEY_SEED": str(conf / "secrets" / "node.nk")}

    monkeypatch.setenv("TANDEM_NATS_CREDS", "/run/secrets/receiver.creds")  # this process's own user
    nats = load_cluster(conf / "cluster.yaml").nats
    assert (nats.creds_file, nats.nkey_seed_file) == ("/run/secrets/receiver.creds", None)
    monkeypatch.setenv("TANDEM_NATS_TLS_CA", "-----BEGIN CERTIFICATE-----")
    with pytest.raises(ConfigError, match=r"TANDEM_NATS_TLS_CA \(environment\): .*put it in a file"):
        load_cluster(conf / "cluster.yaml")


@pytest.mark.parametrize(("settings", "field", "problem"), [
    ({"nkey_seed_file": "a.nk", "creds_file": "a.creds"}, "nats", "give one of them"),
    ({"tls": {"cert_file": "node.pem"}}, "nats.tls", "cert_file and key_file go together"),
    ({"nkey_seed_file": "SUAN36OSR66GMLXFYQ3LSSRKU2HV45IW375BJX4MN42OGEQIANVGQEOEX4"}, "nats.nkey_seed_file",
     "put it in a file"),
    ({"creds_file": "eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ"}, "nats.creds_file", "put it in a file"),
])
def test_credentials_are_refused_when_they_cannot_be_what_they_say(
        conf: Path, monkeypatch: pytest.MonkeyPatch, settings: dict, field: str, problem: str) -> None:
    monkeypatch.delenv("TANDEM_NATS_URL", raising=False)
    nats_section(conf, **settings)
    with pytest.raises(ConfigError, match=rf"cluster\.yaml: {field}: .*{problem}"):
        load_cluster(conf / "cluster.yaml")


def test_credentials_never_cross_the_network_over_plain_nats(conf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("TANDEM_NATS_URL", "TANDEM_NATS_CREDS", "TANDEM_NATS_NKEY_SEED"):
        monkeypatch.delenv(variable, raising=False)
    nats_section(conf, servers=["nats://127.0.0.1:4222", "nats://10.1.2.3:4222"], creds_file="node.creds")
    with pytest.raises(ConfigError) as refused:
        load_cluster(conf / "cluster.yaml")
    assert str(refused.value).startswith(
        f"{conf / 'cluster.yaml'}: nats.servers[1]: nats://10.1.2.3:4222 is plain nats:// to another host, and "
        f"credentials are given ({conf / 'cluster.yaml'}: nats.creds_file): they would cross the network in clear "
        "text. Use tls://10.1.2.3:4222")
    nats_section(conf, servers=["nats://127.0.0.1:4222", "tls://10.1.2.3:4222", "nats://[::1]:4222"])
    assert load_cluster(conf / "cluster.yaml").nats.creds_file == str(conf / "node.creds"), "TLS, or this host"

    nats_section(conf, servers=["nats://10.1.2.3:4222"], creds_file=None)
    assert load_cluster(conf / "cluster.yaml").nats.servers == ("nats://10.1.2.3:4222",), "no credentials: allowed"
    monkeypatch.setenv("TANDEM_NATS_URL", "nats://relay:s3cret@10.1.2.3:4222")
    with pytest.raises(ConfigError, match=r"^TANDEM_NATS_URL \(environment\): nats://relay@10\.1\.2\.3:4222 is "
                                          r"plain nats:// .*the user and password or token in the URL") as refused:
        load_cluster(conf / "cluster.yaml")
    assert "s3cret" not in str(refused.value)
    monkeypatch.setenv("TANDEM_NATS_URL", "nats://relay:s3cret@localhost:4222")
    assert load_cluster(conf / "cluster.yaml").nats.servers == ("nats://relay:s3cret@localhost:4222",)


def test_a_launched_driver_gets_the_files_and_cas_its_launcher_resolved(conf: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from tandem.supervisor.submit_command import child_environment

    monkeypatch.delenv("TANDEM_NATS_URL", raising=False)
    nats_section(conf, servers=["tls://nats.example.com:4222"], creds_file="/run/secrets/node.creds")
    env = child_environment(load_cluster(conf / "cluster.yaml"), base={
        "PATH": "/usr/bin", "SSL_CERT_FILE": "/etc/tandem/ca.pem", "SSL_CERT_DIR": "/etc/tandem/certs",
        "TANDEM_NATS_NKEY_SEED": "/elsewhere.nk"})
    assert env["TANDEM_NATS_CREDS"] == "/run/secrets/node.creds"
    assert (env["SSL_CERT_FILE"], env["SSL_CERT_DIR"]) == ("/etc/tandem/ca.pem", "/etc/tandem/certs")
    assert "TANDEM_NATS_NKEY_SEED" not in env, "only what the launcher resolved"
    assert env["TANDEM_NATS_INBOX_PREFIX"] == "_INBOX"
