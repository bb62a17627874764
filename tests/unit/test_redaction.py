"""What a log may show of a command line: the secrets of its URLs and of its settings masked (pure)."""

from __future__ import annotations

import pytest

from tandem.redaction import MASK, redact_command


@pytest.mark.parametrize("argument, shown", [
    ("spark://tandem:pw-1@10.0.0.5:7077", "spark://tandem@10.0.0.5:7077"),
    ("k8s://https://tok-1@api.example:6443", "k8s://https://api.example:6443"),
    ("spark://10.0.0.5:7077?token=tok-1&x=y", f"spark://10.0.0.5:7077?{MASK}"),
    ("spark.hadoop.fs.s3a.secret.key=sk-1", f"spark.hadoop.fs.s3a.secret.key={MASK}"),
    ("spark.kubernetes.driverEnv.TANDEM_DATABASE_URL=postgresql://u:pw-1@db/t",
     "spark.kubernetes.driverEnv.TANDEM_DATABASE_URL=postgresql://u@db/t"),
    ("spark.ssl.keyStorePassword=pw-1", f"spark.ssl.keyStorePassword={MASK}"),
    ("spark.authenticate.secret=s-1", f"spark.authenticate.secret={MASK}"),
    ("--password=pw-1", f"--password={MASK}"),
    ("sc://host:15002/;token=tok-1;use_ssl=true", f"sc://host:15002/;token={MASK};use_ssl=true"),
    ("local[2]", "local[2]"),
    ("spark.sql.shuffle.partitions=2", "spark.sql.shuffle.partitions=2"),
    ("/srv/tandem/jobs/run_plan.py", "/srv/tandem/jobs/run_plan.py"),
])
def test_one_argument_keeps_everything_but_its_secret(argument, shown):
    assert redact_command(["spark-submit", "--conf", argument]) == ["spark-submit", "--conf", shown]


def test_the_value_after_a_secret_flag_is_masked_and_the_rest_is_kept():
    argv = ["spark-submit", "--master", "spark://a:pw-1@h:7077", "--token", "tok-1", "--name", "tandem:trades/s/n",
            "--principal", "tandem@EXAMPLE.COM", "--keytab", "/etc/tandem.keytab", "app.py", "--plan", "trades"]
    assert redact_command(argv) == ["spark-submit", "--master", "spark://a@h:7077", "--token", MASK, "--name",
                                    "tandem:trades/s/n", "--principal", "tandem@EXAMPLE.COM", "--keytab",
                                    "/etc/tandem.keytab", "app.py", "--plan", "trades"]
    assert "pw-1" not in " ".join(redact_command(argv)) and argv[2] == "spark://a:pw-1@h:7077", "not changed in place"
