"""``GET jobs?owner=``: the sidebar's owner filter, and what it cannot widen."""

UNPLACEABLE = {"command": ["true"], "resources": {"gpus": 8}}


async def _submitter(gl_api, name: str) -> str:
    status, tok = await gl_api(
        "tokens", method="POST", json_body={"name": name, "role": "submitter"}
    )
    assert status == 201
    return tok["token"]


async def test_owner_filter_lists_one_owners_jobs(gl_api):
    ada, bob = await _submitter(gl_api, "ada"), await _submitter(gl_api, "bob")
    _, mine = await gl_api("jobs", method="POST", json_body=UNPLACEABLE, token=ada)
    _, theirs = await gl_api("jobs", method="POST", json_body=UNPLACEABLE, token=bob)
    status, page = await gl_api("jobs", params={"owner": "ada"})
    assert status == 200
    assert [j["id"] for j in page["jobs"]] == [mine["id"]]
    _, page = await gl_api("jobs", params={"owner": "bob", "state": "queued"})
    assert [j["id"] for j in page["jobs"]] == [theirs["id"]]
    _, page = await gl_api("jobs", params={"owner": "nobody"})
    assert page["jobs"] == []


async def test_a_submitter_cannot_list_another_owners_jobs(gl_api):
    ada, bob = await _submitter(gl_api, "ada"), await _submitter(gl_api, "bob")
    await gl_api("jobs", method="POST", json_body=UNPLACEABLE, token=ada)
    _, own = await gl_api("jobs", method="POST", json_body=UNPLACEABLE, token=bob)
    _, page = await gl_api("jobs", params={"owner": "ada"}, token=bob)
    assert [j["id"] for j in page["jobs"]] == [own["id"]]
