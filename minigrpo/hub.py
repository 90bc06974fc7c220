"""Downloads from the Hugging Face hub that stop at once where the hub cannot be reached.

huggingface_hub retries a connection that fails five times, 1 to 8 s apart, with a warning line each time: offline,
half a minute of noise before the one line that says what to pass instead. One request first, through the hub
client's own session (its proxies, certificates and HF_ENDPOINT) with its own metadata timeout, tells a dead
connection from a live one: where it answers, the download runs exactly as it would without the probe; where it
does not, only the local cache is read, and nothing there is one error at once."""


def unreachable() -> str | None:
    """Why the hub cannot be reached (one line), or None where it answers, with any status (an answer is enough).
    Whatever the request raises means no answer came: the session's transport (httpx, httpx2 or requests, by the
    hub client's version) names its errors its own way. HF_HUB_OFFLINE=1 is the user's own word: no request, and
    the client reads its cache alone."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session
    if constants.HF_HUB_OFFLINE:
        return None
    try:
        get_session().head(constants.ENDPOINT, timeout=constants.HF_HUB_ETAG_TIMEOUT)
    except Exception as e:          # noqa: BLE001 - see above
        return f"{constants.ENDPOINT} did not answer ({type(e).__name__}: {(str(e).splitlines() or [''])[0]})"
    return None


def fetch(download, **kwargs):
    """download(**kwargs) (hf_hub_download, snapshot_download) as is where the hub answers; where it does not, the
    cached copy (local_files_only=True), else a ConnectionError saying the hub did not answer and nothing is
    cached."""
    why = unreachable()
    if why is None:
        return download(**kwargs)
    try:
        return download(**kwargs, local_files_only=True)
    except Exception:       # the client's "outgoing traffic has been disabled" would blame the user's settings
        raise ConnectionError(f"{why}, and the local cache does not hold it") from None
