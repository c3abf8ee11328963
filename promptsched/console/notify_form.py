"""The schedule form's notification section: its fields, its HTML, and the ``notify`` input it
makes for ``notify_targets.validate_targets``.

Credentials are write-only: the webhook secret and the Slack and Discord incoming-webhook URLs
are never put back into the page. A stored one is described ("set: https://hooks.slack.com/…#1a2b3c")
and kept while its field is left empty; typing a new value replaces it, ticking Remove drops
it. A webhook secret promptsched generates is shown once, on the page that answers the save.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from promptsched.console.html import Markup, Template, attrs, join
from promptsched.errors import ValidationError
from promptsched.ops import notify_targets

CHATS = (("slack", "Slack incoming webhook"), ("discord", "Discord webhook"),
         ("ntfy", "ntfy topic"))  # fmt: skip
FIELDS = (
    "notify_email", "notify_webhook", "notify_webhook_secret",
    *(f"notify_{name}" for name, _ in CHATS), *(f"notify_remove_{name}" for name, _ in CHATS),
    "notify_on_success", "notify_on_failure",
)  # fmt: skip
# What the section shows for a new schedule: nobody notified, both events ticked.
DEFAULTS = {"notify_on_success": "on", "notify_on_failure": "on"}

_SECTION = Template("""<fieldset class="notify" id="notify">
<legend>Notifications</legend>
<p class="describe" id="notify-words">$words</p>
$message
<div class="field"><label for="f-notify_email">Email addresses</label>
<input id="f-notify_email" name="notify_email" type="text" value="$emails" \
autocomplete="off" spellcheck="false">
<small class="hint">comma-separated; one message goes to all of them</small></div>
<div class="field"><label for="f-notify_webhook">Webhook URL (signed JSON POST)</label>
<input id="f-notify_webhook" name="notify_webhook" type="url" value="$webhook" \
autocomplete="off" spellcheck="false">
<small class="hint">empty: no webhook</small></div>
<div class="field"><label for="f-notify_webhook_secret">Webhook signing secret</label>
<input id="f-notify_webhook_secret" name="notify_webhook_secret" type="password" value="" \
autocomplete="new-password">
<small class="hint">$secret_hint</small></div>
$chats
<div class="field"><span class="label">Notify when a run</span>
<label><input type="checkbox" name="notify_on_success" value="on"$on_success> succeeds</label>
<label><input type="checkbox" name="notify_on_failure" value="on"$on_failure> fails \
(and when the schedule is paused or drops ticks)</label></div>
</fieldset>""")
_CHAT = Template("""<div class="field"><label for="f-notify_$name">$label URL</label>
<input id="f-notify_$name" name="notify_$name" type="password" value="" \
autocomplete="off" spellcheck="false">
<small class="hint" id="notify-$name-state">$state</small>$remove</div>""")
_REMOVE = Template("""<label><input type="checkbox" name="notify_remove_$name" \
value="on"$checked> Remove</label>""")
_MESSAGE = Template('<small class="message" role="alert" id="m-notify">$text</small>')


def submitted(field: Any) -> dict[str, str]:
    """The section's fields from a posted form (``field(name, default)``); an unticked
    checkbox is absent from the post, so it reads as empty here."""
    return {name: field(name, "") for name in FIELDS}


def values_of(stored: Mapping[str, Any] | None) -> dict[str, str]:
    """The fields as the edit form opens with them (credentials left empty)."""
    notify = dict(stored or {})
    hook = notify.get("webhook")
    return {
        "notify_email": ", ".join(notify.get("email") or []),
        "notify_webhook": str(hook.get("url") or "") if isinstance(hook, Mapping) else "",
        "notify_webhook_secret": "",
        **{f"notify_{name}": "" for name, _ in CHATS},
        **{f"notify_remove_{name}": "" for name, _ in CHATS},
        "notify_on_success": "on" if notify.get("on_success", True) else "",
        "notify_on_failure": "on" if notify.get("on_failure", True) else "",
    }


def notify_input(values: Mapping[str, str], stored: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``notify`` input the section asks for; a credential left empty keeps the stored
    one (``validate_targets`` takes it from ``current``)."""
    current = dict(stored or {})
    raw: dict[str, Any] = {
        "on_success": values.get("notify_on_success") == "on",
        "on_failure": values.get("notify_on_failure") == "on",
    }
    emails = [e.strip() for e in values.get("notify_email", "").split(",") if e.strip()]
    if emails:
        raw["email"] = emails
    url = values.get("notify_webhook", "").strip()
    secret = values.get("notify_webhook_secret", "")
    if url:
        raw["webhook"] = {"url": url, **({"secret": secret} if secret else {})}
    elif secret:
        raise ValidationError("notify.webhook.url", "give the webhook's URL with its secret")
    for name, _label in CHATS:
        typed = values.get(f"notify_{name}", "").strip()
        if values.get(f"notify_remove_{name}") == "on" and not typed:
            continue
        if typed:
            raw[name] = {"url": typed}
        elif isinstance(current.get(name), Mapping):
            raw[name] = {"url_set": True}  # keep the stored URL
    return raw


def section(
    values: Mapping[str, str], stored: Mapping[str, Any] | None, error: ValidationError | None
) -> Markup:
    """The fieldset, with the stored targets described in words (never a credential)."""
    shown = notify_targets.public(stored or {})
    hook = shown.get("webhook")
    secret_set = isinstance(hook, Mapping) and hook.get("secret_set")
    chats = []
    for name, label in CHATS:
        chat = shown.get(name)
        state = (
            f"set: {chat['url']}; leave empty to keep it, or type a new URL"
            if isinstance(chat, Mapping) and chat.get("url")
            else "empty: none"
        )
        has = isinstance(chat, Mapping)
        remove = (
            _REMOVE(name=name, checked=attrs(checked=values.get(f"notify_remove_{name}") == "on"))
            if has
            else Markup("")
        )
        chats.append(_CHAT(name=name, label=label, state=state, remove=remove))
    wrong = error is not None and error.field.startswith("notify")
    return _SECTION(
        words="Notifies: " + notify_targets.words(shown) if stored else "Notifies nobody.",
        message=_MESSAGE(text=f"{error.field}: {error.message}") if wrong and error else "",
        emails=values.get("notify_email", ""),
        webhook=values.get("notify_webhook", ""),
        secret_hint="set; leave empty to keep it, or type a new one to rotate it"
        if secret_set
        else "empty: promptsched generates one and shows it once after saving",
        chats=join(chats, "\n"),
        on_success=attrs(checked=values.get("notify_on_success") == "on"),
        on_failure=attrs(checked=values.get("notify_on_failure") == "on"),
    )


_SECRET_PAGE = Template("""<p>The schedule was saved. Its webhook requests are signed with this
secret, shown <strong>only this once</strong>: store it where your receiver reads it.</p>
<p><code class="secret" id="webhook-secret">$secret</code></p>
<p>Standard Webhooks libraries take it as it is. <a href="$href">Go to the schedule</a></p>""")


def new_secret(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> str | None:
    """The webhook secret promptsched generated in this save, if it did (None when the user
    typed it, kept it, or there is no webhook)."""
    old = (before or {}).get("webhook")
    new = (after or {}).get("webhook")
    if not isinstance(new, Mapping) or not new.get("secret"):
        return None
    if isinstance(old, Mapping) and old.get("secret") == new["secret"]:
        return None
    return str(new["secret"])


def secret_page(secret: str, href: str) -> Markup:
    return _SECRET_PAGE(secret=secret, href=href)
