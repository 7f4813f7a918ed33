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

from reconciler.hub.client import endpoint as endpoint
from reconciler.hub.client import token as token
from reconciler.hub.download import DOWNLOAD_CACHE as DOWNLOAD_CACHE
from reconciler.hub.download import downloaded as downloaded
from reconciler.hub.download import fetch as fetch
from reconciler.hub.download import fetch_order as fetch_order
from reconciler.hub.failures import translate as translate
from reconciler.hub.failures import within_deadline as within_deadline
from reconciler.hub.listing import HubListing as HubListing
from reconciler.hub.listing import list_files as list_files
from reconciler.hub.listing import manifest_entries as manifest_entries
from reconciler.hub.listing import resolve as resolve
