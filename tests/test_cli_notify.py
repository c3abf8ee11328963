"""Notify targets from the command line (`schedules add` and `schedules edit`), remote through
the API and direct through the database: every target kind, the webhook secret shown once or
read from a file, chat URLs never shown again, and bad input refused naming the flag."""

from __future__ import annotations

import json
from pathlib import Path

from promptsched.ops import notify_targets
from tests.test_cli_remote import Cli, _sql, _token, api_service, run_cli  # noqa: F401

SLACK = "https://hooks.slack.com/services/T000/B000/SLACKSECRET"
DISCORD = "https://discord.com/api/webhooks/1/DISCORDSECRET"
NTFY = "https://ntfy.sh/NTFYSECRET-topic"
ADD = ("schedules", "add", "--name", "digest", "--cron", "0 9 * * 1", "--prompt", "p")


def stored_notify(dsn: str, sid: int) -> dict[str, object]:
    raw = _sql(dsn, "SELECT notify FROM schedules WHERE id = $1", sid)
    return raw if isinstance(raw, dict) else json.loads(raw)


def test_add_and_edit_every_target_kind_remote_and_direct(
    run_cli: Cli,  # noqa: F811
    dsn: str,
    tmp_path: Path,
) -> None:
    alice = _token(run_cli, "alice")
    code, out, err = run_cli(
        *ADD, "--email", "ops@example.com", "--email", "me@example.com",
        "--webhook", "https://hooks.example.com/in", "--slack", SLACK, "--discord", DISCORD,
        "--ntfy", NTFY, "--notify-on", "failure", token=alice,
    )  # fmt: skip
    assert code == 0, err
    sid = int(out.split()[2])
    stored = stored_notify(dsn, sid)
    secret = stored["webhook"]["secret"]  # type: ignore[index]
    # The generated secret is printed once, in words; the chat URLs never are.
    assert f"signed with secret {secret} (shown once)" in out
    assert "email ops@example.com, me@example.com" in out
    slack, discord = notify_targets.mask_url(SLACK), notify_targets.mask_url(DISCORD)
    ntfy = notify_targets.mask_url(NTFY)
    assert f"Slack {slack}; Discord {discord}; ntfy {ntfy} on failure" in out
    assert "SLACKSECRET" not in out and "DISCORDSECRET" not in out and "NTFYSECRET" not in out
    assert stored_notify(dsn, sid)["ntfy"] == {"url": NTFY}
    assert stored["slack"] == {"url": SLACK} and stored["discord"] == {"url": DISCORD}
    assert (stored["on_success"], stored["on_failure"]) == (False, True)
    shown = run_cli.json("schedules", "show", str(sid), token=alice)
    assert secret not in json.dumps(shown) and "SECRET" not in json.dumps(shown)
    assert shown["notify"]["webhook"]["secret_set"] is True

    # Direct mode: sign with a secret from a file (never echoed), replace the Discord hook;
    # the Slack hook and the emails stay.
    secret_file = tmp_path / "hook.secret"
    secret_file.write_text("my-receivers-secret-0123\n")
    new_discord = "https://discord.com/api/webhooks/2/OTHERSECRET"
    code, out, err = run_cli(
        "schedules", "edit", str(sid), "--webhook-secret-file", str(secret_file),
        "--discord", new_discord,
    )  # fmt: skip
    assert code == 0, err
    assert f"signed with the secret in {secret_file}" in out and "my-receivers" not in out
    stored = stored_notify(dsn, sid)
    assert stored["webhook"] == {
        "url": "https://hooks.example.com/in",
        "secret": "my-receivers-secret-0123",
    }
    assert stored["discord"] == {"url": new_discord} and stored["slack"] == {"url": SLACK}
    assert stored["email"] == ["ops@example.com", "me@example.com"]
    # The history shows the Discord hook changed (by its fingerprint), never the URL itself.
    [change, *_] = run_cli.json("schedules", "history", str(sid))
    before, after = change["changes"]["notify"]
    assert before["discord"]["url"] == notify_targets.mask_url(DISCORD)
    assert after["discord"]["url"] == notify_targets.mask_url(new_discord)
    assert "SECRET" not in json.dumps(change)

    # Bad input names the flag or field and changes nothing.
    before = stored_notify(dsn, sid)
    for argv, named in (
        (("--slack", "ftp://hooks.slack.com/x"), "notify.slack.url"),
        (("--discord", "http://10.0.0.7/api/webhooks/1/x"), "notify.discord.url"),
        (("--webhook-secret-file", str(tmp_path / "missing")), "--webhook-secret-file"),
        (("--no-notify", "--slack", SLACK), "--no-notify"),
        (("--email", "not-an-address"), "notify.email[0]"),
    ):
        code, out, err = run_cli("schedules", "edit", str(sid), *argv, token=alice)
        assert code != 0 and named in err and "Traceback" not in err, (argv, err)
    assert stored_notify(dsn, sid) == before

    edited = run_cli.json("schedules", "edit", str(sid), "--no-notify", token=alice)
    assert edited["notify"] == {} and stored_notify(dsn, sid) == {}
