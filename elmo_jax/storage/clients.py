"""The clients of remote storage behind `paths`: one fsspec file system per
scheme (gcsfs for gs://, s3fs for s3://), the credentials they need, their
exceptions as one `StorageError` line each, and the retries that outlast a
transient outage of the service.

Credentials are found as each client finds them (gs://: the service
emulator's `STORAGE_EMULATOR_HOST`, `GOOGLE_APPLICATION_CREDENTIALS`,
gcloud's application-default file, the metadata server of a Cloud VM; s3://:
boto's `AWS_*` and files). gcsfs, finding none, asks the metadata server for
about 15 s and then goes on anonymously, so that every request fails after
its retries (a minute or more); elmo-jax asks the metadata server once, for
at most `METADATA_TIMEOUT_S`, and says what to set instead.
"""
from __future__ import annotations

import contextlib
import os
import re
import time

from elmo_jax import environment
from elmo_jax.errors import PathError, StorageError, UserError

# scheme -> (the fsspec protocol, the package that implements it, the extra)
REMOTE = {"gs": ("gcs", "gcsfs", "gcs"), "s3": ("s3", "s3fs", "s3")}
METADATA_TIMEOUT_S = 2.0


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
# gs:/b: a bucket path through os.path.normpath (the "gs:" folder of old)
_ONE_SLASH = re.compile(r"^(gs|s3):/(?!/)", re.IGNORECASE)
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._\-]{1,220}[a-z0-9]$")


def scheme(path: str | os.PathLike) -> str | None:
    """"gs" or "s3" for a bucket path, None for a local one; a PathError for
    any other scheme or a malformed bucket path."""
    text = os.fspath(path)
    one = _ONE_SLASH.match(text)
    if one:
        raise PathError(f"{text}: a bucket path is {one.group(1).lower()}://BUCKET/PATH "
                        "(two slashes)")
    m = _SCHEME.match(text)  # a local name may hold a colon ("a:b"), never "://"
    if m is None:
        return None
    name = m.group(1).lower()
    if name == "file":
        return None
    if name not in REMOTE:
        raise PathError(f"{text}: elmo-jax reads and writes local paths, gs://BUCKET/... and "
                        f"s3://BUCKET/...; not {name}://")
    bucket = text[m.end():].split("/", 1)[0]
    if not _BUCKET.match(bucket):
        raise PathError(f"{text}: {bucket!r} is not a bucket name (3-222 characters: "
                        "lower-case letters, digits, '.', '-' and '_')")
    return name


def filesystem(path):
    """The fsspec file system of a bucket path (one per scheme and process)."""
    name = scheme(path)
    protocol, package, extra = REMOTE[name]
    try:
        import fsspec

        fsspec.get_filesystem_class(protocol)
    except ImportError:
        raise PathError(f"{path}: {name}:// paths need {package}: pip install "
                        f"'elmo-jax[{extra}]'") from None
    if name == "gs":
        _check_google_credentials(path)
    # no listing cache: other processes and hosts write the same prefixes
    return fsspec.filesystem(protocol, use_listings_cache=False)


_FOUND_CREDENTIALS: list[bool] = []


def _check_google_credentials(path) -> None:
    """A StorageError naming what to set when this machine has no Google
    credentials: no emulator, key file, gcloud login or fsspec token, and no
    metadata server answering within METADATA_TIMEOUT_S (asked once a
    process)."""
    if _FOUND_CREDENTIALS:
        return
    env = os.environ
    gcloud = env.get("CLOUDSDK_CONFIG") or os.path.join(os.path.expanduser("~"), ".config",
                                                        "gcloud")
    if not (env.get("STORAGE_EMULATOR_HOST") or env.get("GOOGLE_APPLICATION_CREDENTIALS")
            or env.get("FSSPEC_GCS_TOKEN")
            or os.path.exists(os.path.join(gcloud, "application_default_credentials.json"))
            or _metadata_server_answers()):
        host = env.get("GCE_METADATA_HOST") or "metadata.google.internal"
        raise StorageError(
            f"no credentials for {path}: set GOOGLE_APPLICATION_CREDENTIALS to a service "
            "account's key file, or run `gcloud auth application-default login`, or run on a "
            f"Cloud VM whose service account has access (no metadata server answered at {host} "
            f"within {METADATA_TIMEOUT_S:g} s); a public bucket reads with FSSPEC_GCS_TOKEN=anon")
    _FOUND_CREDENTIALS.append(True)


def _metadata_server_answers() -> bool:
    """Whether a Cloud VM's metadata server answers (as google-auth asks it)."""
    import urllib.request

    if os.environ.get("NO_GCE_CHECK", "").lower() == "true":
        return False
    host = os.environ.get("GCE_METADATA_HOST") or "metadata.google.internal"
    request = urllib.request.Request(f"http://{host}/computeMetadata/v1/",
                                     headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=METADATA_TIMEOUT_S) as r:
            return r.headers.get("Metadata-Flavor") == "Google"
    except Exception:  # refused, unresolved, timed out, an HTTP error: not a Cloud VM's
        return False


def forget_listings(path) -> None:
    """Drop what the file system of orbax's paths (etils' epath, over fsspec)
    remembers of the bucket's listings: it keeps them for the process's life,
    and another process (a run's other hosts, a rerun) may have written since.
    Ours because the alternative, fsspec's process-wide config
    (`use_listings_cache=False` for every gcs file system), would change the
    process for the user's code too; elmo-jax's own file systems are made
    without a listing cache (`filesystem`)."""
    if scheme(path) is None:
        return
    import fsspec

    protocol = REMOTE[scheme(path)][0]
    kwargs = {"finalize_on_close": True} if protocol == "gcs" else {}
    fsspec.filesystem(protocol, **kwargs).invalidate_cache()


@contextlib.contextmanager
def storage_errors(path):
    """Turn a remote client's exceptions into one StorageError line."""
    try:
        yield
    except (UserError, FileNotFoundError, FileExistsError, IsADirectoryError):
        raise
    except Exception as e:
        raise storage_error(path, e) from None


_CREDENTIALS = {"gs": "GOOGLE_APPLICATION_CREDENTIALS (a service account's key file), or run "
                      "`gcloud auth application-default login`, or run on a Cloud VM whose "
                      "service account has access",
                "s3": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or run "
                      "on a machine whose role has access"}


# the services' own error codes (S3's `Error.Code`, GCS's HTTP status)
_REFUSED_KEYS = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidClientTokenId",
                 "ExpiredToken", "InvalidToken", "TokenRefreshRequired"}
_NO_PERMISSION = {"AccessDenied", "AllAccessDisabled", "AccountProblem"}
_NO_BUCKET = {"NoSuchBucket"}
_QUOTA = {"QuotaExceeded", "ServiceQuotaExceeded", "StorageQuotaExceeded"}


def _service_answer(e: BaseException) -> tuple[int | None, str]:
    """(HTTP status, the service's error code) behind a client's exception:
    botocore's ClientError (s3fs raises a builtin from it, the ClientError
    its cause), gcsfs's HttpError (its status; GCS's reason is not kept);
    (None, "") when the service said nothing (unreachable, a timeout)."""
    for x in (e, e.__cause__, e.__context__):
        response = getattr(x, "response", None)
        if isinstance(response, dict) and isinstance(response.get("Error"), dict):
            return (response.get("ResponseMetadata", {}).get("HTTPStatusCode"),
                    str(response["Error"].get("Code") or ""))
        if _is_type(x, "gcsfs.retry", "HttpError") and isinstance(x.code, int):
            return x.code, ""
    return None, ""


def _is_type(e: BaseException | None, module: str, name: str) -> bool:
    """Whether `e` (or its cause) is `module.name`, a client library's class
    (imported only if the client is installed)."""
    import importlib

    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return False
    return any(isinstance(x, cls) for x in (e, getattr(e, "__cause__", None),
                                            getattr(e, "__context__", None)) if x is not None)


def storage_error(path, e: BaseException) -> StorageError:
    """A client's exception as one line that says what to do, told apart by
    the exception's type and the service's status and error code. Only a
    failure of the service (unreachable, 5xx, 429) is `transient`."""
    status, code = _service_answer(e)
    name = scheme(path) or "gs"
    bucket = str(path).split("/")[2] if scheme(path) else ""
    said = first_line(e)
    # gcsfs raises GCS's 403 as a bare OSError("Forbidden: ...") without the
    # reason: its message is all that tells an exhausted quota from a refusal
    gcs_forbidden = type(e) is OSError and str(e).startswith("Forbidden:")
    if code in _QUOTA or status == 507 or (gcs_forbidden and "quota" in str(e).lower()):
        why = (f"{path}: the storage quota is exhausted ({said}): raise the quota or free "
               "space; nothing was lost, and the same command goes on from where it stopped")
    elif status == 401 or _is_type(e, "botocore.exceptions", "NoCredentialsError"):
        why = f"no credentials for {path}: set {_CREDENTIALS[name]}"
    elif code in _REFUSED_KEYS or _is_type(e, "google.auth.exceptions", "RefreshError"):
        why = f"the credentials for {path} were refused ({said}): set {_CREDENTIALS[name]}"
    elif code in _NO_PERMISSION or status == 403 or gcs_forbidden \
            or isinstance(e, PermissionError):
        why = (f"no permission for {path} ({said}): give this machine's account access to "
               f"the bucket {bucket}")
    elif code in _NO_BUCKET:
        why = f"the bucket {bucket} of {path} does not exist: create it, or check its name"
    else:  # unreachable, a 5xx, rate limited (429, SlowDown): it may answer again
        return StorageError(f"{path}: the storage service failed ({type(e).__name__}: "
                            f"{said}); nothing was lost: run the same command again once it "
                            "answers", transient=True)
    return StorageError(why)


def first_line(e: BaseException) -> str:
    """The message of `e` on one line, at most 300 characters."""
    text = " ".join(str(e).split())
    return text[:300] if text else repr(e)


RETRY_ENV = environment.STORAGE_RETRY_SECONDS
RETRY_SECONDS = 300.0  # a bucket's transient outage outlasted by elmo-jax's writes


def retry_seconds() -> float:
    """How long a write to a bucket is tried again while the storage service
    fails: $ELMO_JAX_STORAGE_RETRY_SECONDS, else 300 (beyond the clients' own
    retries, which outlast a blip of seconds)."""
    try:
        return environment.storage_retry_seconds(RETRY_SECONDS)
    except ValueError:
        raise PathError(f"{RETRY_ENV} must be a number of seconds, got "
                        f"{os.environ[RETRY_ENV]!r}") from None


def retry(fn, path, *, seconds: float | None = None, first_wait: float = 1.0):
    """`fn()`, tried again with backoff for up to `seconds` (default
    `retry_seconds()`) while the storage service fails (a transient outage);
    past that its StorageError, which says how long it was tried."""
    seconds = retry_seconds() if seconds is None else seconds
    deadline, wait = time.monotonic() + seconds, first_wait
    while True:
        try:
            return fn()
        except StorageError as e:
            if not e.transient:
                raise
            if time.monotonic() + wait > deadline:
                raise StorageError(f"{e} (tried for {seconds:g} s: {RETRY_ENV})") from None
        time.sleep(wait)
        wait = min(wait * 2, 30.0)
