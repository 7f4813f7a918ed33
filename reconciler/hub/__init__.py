"""The Hugging Face Hub client, as the checkpoint component uses it: the real `huggingface_hub`
client with the spec's endpoint (HF_ENDPOINT semantics), pinned revision and token (from
$HF_TOKEN or model.token_file; never printed, never in argv).

    client.py     the token, the endpoint and the client's time limits
    failures.py   every client failure translated into a HubError in the user's terms; a deadline
                  on each question
    listing.py    the repo's files at a commit, and the manifest beside them
    download.py   downloading them with the real client, resuming a killed download mid-file
    ranges.py     one big file in several HTTP Range streams, resumable
"""

from reconciler.hub.client import endpoint, token
from reconciler.hub.download import DOWNLOAD_CACHE, downloaded, fetch, fetch_order
from reconciler.hub.failures import translate, within_deadline
from reconciler.hub.listing import HubListing, list_files, manifest_entries, resolve

__all__ = [
    "DOWNLOAD_CACHE",
    "HubListing",
    "downloaded",
    "endpoint",
    "fetch",
    "fetch_order",
    "list_files",
    "manifest_entries",
    "resolve",
    "token",
    "translate",
    "within_deadline",
]
