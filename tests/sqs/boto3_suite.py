"""crest's SQS-compatible API through real AWS clients: boto3 and the AWS CLI.

Run by tests/sqs.rs against a `crest local` it starts, with
SQS_ENDPOINT, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY set. Each check names what
it shows; any failure raises and the process exits non-zero.
"""

import base64
import hashlib
import json
import os
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid

import boto3
import botocore.exceptions
from botocore.config import Config

ENDPOINT = os.environ["SQS_ENDPOINT"]
KEY = os.environ["AWS_ACCESS_KEY_ID"]
SECRET = os.environ["AWS_SECRET_ACCESS_KEY"]


# SDK retries as applications run them ("standard": ServiceUnavailable and throttles are
# tried again, client errors never), so a tree still starting on a loaded machine is waited
# for, and every error code the checks expect still comes on the first answer.
RETRIES = {"max_attempts": 3, "mode": "standard"}


def client(key=KEY, secret=SECRET, region="us-east-1", validate=True):
    return boto3.client(
        "sqs",
        endpoint_url=ENDPOINT,
        region_name=region,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=Config(retries=RETRIES, parameter_validation=validate),
    )


sqs = client()


def error_code(call):
    try:
        call()
    except botocore.exceptions.ClientError as error:
        return error.response["Error"]["Code"]
    raise AssertionError("the call succeeded")


def md5_of_attributes(attributes):
    """SQS's MD5OfMessageAttributes, written from AWS's description, independently of crest."""
    out = b""
    for name in sorted(attributes):
        value = attributes[name]
        kind = value["DataType"]
        out += struct.pack(">I", len(name.encode())) + name.encode()
        out += struct.pack(">I", len(kind.encode())) + kind.encode()
        if "BinaryValue" in value:
            data = value["BinaryValue"]
            out += b"\x02" + struct.pack(">I", len(data)) + data
        else:
            data = value["StringValue"].encode()
            out += b"\x01" + struct.pack(">I", len(data)) + data
    return hashlib.md5(out).hexdigest()


def priority(p):
    return {"Priority": {"DataType": "Number", "StringValue": str(p)}}


def receive_all(url, count, **extra):
    """Receives until `count` messages came (each receive long-polls), within 20 s."""
    got = []
    deadline = time.time() + 20
    while len(got) < count and time.time() < deadline:
        answer = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=2, **extra
        )
        got.extend(answer.get("Messages", []))
    assert len(got) == count, f"received {len(got)} of {count}"
    return got


def delete_all(url, messages):
    for i in range(0, len(messages), 10):
        part = messages[i : i + 10]
        answer = sqs.delete_message_batch(
            QueueUrl=url,
            Entries=[
                {"Id": f"d{j}", "ReceiptHandle": m["ReceiptHandle"]}
                for j, m in enumerate(part)
            ],
        )
        assert len(answer["Successful"]) == len(part), answer


def queues_are_created_found_listed_and_checked():
    url = sqs.create_queue(QueueName="boto-jobs", Attributes={"VisibilityTimeout": "5"})[
        "QueueUrl"
    ]
    assert url.endswith("/default/boto-jobs"), url
    assert sqs.get_queue_url(QueueName="boto-jobs")["QueueUrl"] == url
    # The same attributes again: the same queue.
    assert sqs.create_queue(QueueName="boto-jobs", Attributes={"VisibilityTimeout": "5"})[
        "QueueUrl"
    ] == url
    assert url in sqs.list_queues(QueueNamePrefix="boto-")["QueueUrls"]
    # As SQS: only the attributes a CreateQueue gives are compared with the queue's.
    assert sqs.create_queue(QueueName="boto-jobs")["QueueUrl"] == url
    assert sqs.create_queue(QueueName="boto-jobs", Attributes={"DelaySeconds": "0"})[
        "QueueUrl"
    ] == url
    try:
        sqs.create_queue(QueueName="boto-jobs", Attributes={"VisibilityTimeout": "6"})
        raise AssertionError("created a queue over one with other attributes")
    except botocore.exceptions.ClientError as error:
        refusal = error.response["Error"]
        assert refusal["Code"] == "QueueAlreadyExists", refusal
        assert refusal["Message"].endswith("a different value for attribute VisibilityTimeout"), refusal
    # SQS also takes a queue's name where its URL goes.
    sqs.send_message(QueueUrl="boto-jobs", MessageBody="by name")
    got = sqs.receive_message(QueueUrl="boto-jobs", WaitTimeSeconds=5)["Messages"]
    assert [m["Body"] for m in got] == ["by name"], got
    sqs.delete_message(QueueUrl="boto-jobs", ReceiptHandle=got[0]["ReceiptHandle"])
    try:
        sqs.get_queue_url(QueueName="no-such-queue")
        raise AssertionError("found a queue that does not exist")
    except sqs.exceptions.QueueDoesNotExist:
        pass
    code = error_code(
        lambda: sqs.create_queue(QueueName="bad", Attributes={"DelaySeconds": "901"})
    )
    assert code == "InvalidParameterValue", code
    code = error_code(lambda: sqs.create_queue(QueueName="bad name"))
    assert code == "InvalidParameterValue", code
    # Listings page as SQS's: NextToken only when MaxResults is given and more remain; no
    # QueueUrls member when nothing is listed.
    pages = [sqs.create_queue(QueueName=f"boto-page-{i}")["QueueUrl"] for i in range(3)]
    first = sqs.list_queues(QueueNamePrefix="boto-page-", MaxResults=2)
    assert first["QueueUrls"] == pages[:2] and "NextToken" in first, first
    rest = sqs.list_queues(QueueNamePrefix="boto-page-", MaxResults=2, NextToken=first["NextToken"])
    assert rest["QueueUrls"] == pages[2:] and "NextToken" not in rest, rest
    assert "NextToken" not in sqs.list_queues(QueueNamePrefix="boto-page-"), "no MaxResults"
    assert "QueueUrls" not in sqs.list_queues(QueueNamePrefix="no-such-prefix")
    # A standard queue cannot take a FIFO queue's name.
    code = error_code(lambda: sqs.create_queue(QueueName="boto-standard.fifo"))
    assert code == "InvalidParameterValue", code
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["VisibilityTimeout"] == "5", attributes
    # Encryption at rest answered as it is: crest does not encrypt its logs.
    assert attributes["SqsManagedSseEnabled"] == "false", attributes
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"SqsManagedSseEnabled": "false"})
    code = error_code(
        lambda: sqs.set_queue_attributes(QueueUrl=url, Attributes={"SqsManagedSseEnabled": "true"})
    )
    assert code == "InvalidAttributeValue", code
    assert attributes["ApproximateNumberOfMessages"] == "0", attributes
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "0"})
    # A Policy is kept and answered as given (crest's grants decide access), "" removes it.
    policy = json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": "*", "Action": "sqs:SendMessage",
                       "Resource": "*", "Sid": "send"}],
    })
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"Policy": policy})
    for names in (["All"], ["Policy"]):
        got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
        assert json.loads(got["Policy"])["Statement"][0]["Action"] == "sqs:SendMessage", names
    code = error_code(
        lambda: sqs.set_queue_attributes(QueueUrl=url, Attributes={"Policy": "{not json"})
    )
    assert code == "InvalidParameterValue", code
    # A queue's attributes, policy and tags together are bounded by the tree's
    # topic_attributes_bytes_max (16 KiB by default): past it, refused naming the bound.
    large = json.dumps({"Version": "2012-10-17", "Statement": [], "Id": "x" * 17_000})
    try:
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"Policy": large})
        raise AssertionError("a policy past the tree's bound was kept")
    except botocore.exceptions.ClientError as error:
        assert "topic_attributes_bytes_max" in error.response["Error"]["Message"], error.response
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"Policy": ""})
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert "Policy" not in got, got
    # Tags, kept with the queue in the tree: set, overwritten, case-sensitive, removed (an
    # absent key ignored); none listed leaves the member out; given at creation too.
    assert "Tags" not in sqs.list_queue_tags(QueueUrl=url)
    sqs.tag_queue(QueueUrl=url, Tags={"team": "a", "Team": "b", "empty": ""})
    sqs.tag_queue(QueueUrl=url, Tags={"team": "A", "cost": "7"})
    tags = sqs.list_queue_tags(QueueUrl=url)["Tags"]
    assert tags == {"team": "A", "Team": "b", "empty": "", "cost": "7"}, tags
    sqs.untag_queue(QueueUrl=url, TagKeys=["Team", "empty", "absent"])
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "A", "cost": "7"}
    tagged = sqs.create_queue(QueueName="boto-tagged", tags={"owner": "ops"})["QueueUrl"]
    assert sqs.list_queue_tags(QueueUrl=tagged)["Tags"] == {"owner": "ops"}
    code = error_code(
        lambda: sqs.tag_queue(QueueUrl=url, Tags={f"k{i}": "v" for i in range(50)})
    )
    assert code == "InvalidParameterValue", code
    # A deleted queue is gone with its messages; created again, it starts empty.
    gone = sqs.create_queue(QueueName="boto-gone")["QueueUrl"]
    sqs.send_message(QueueUrl=gone, MessageBody="lost")
    sqs.delete_queue(QueueUrl=gone)
    code = error_code(lambda: sqs.get_queue_url(QueueName="boto-gone"))
    assert code == "AWS.SimpleQueueService.NonExistentQueue", code
    assert gone not in sqs.list_queues(QueueNamePrefix="boto-").get("QueueUrls", [])
    assert sqs.create_queue(QueueName="boto-gone")["QueueUrl"] == gone
    empty = sqs.receive_message(QueueUrl=gone, WaitTimeSeconds=1)
    assert "Messages" not in empty, empty


def redrive_sends_a_message_out_of_receives_to_its_dead_letter_queue_and_back():
    dlq = sqs.create_queue(QueueName="boto-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "2"})
    url = sqs.create_queue(QueueName="boto-redriven", Attributes={"RedrivePolicy": policy})[
        "QueueUrl"
    ]
    listed = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["RedrivePolicy"])
    redrive = json.loads(listed["Attributes"]["RedrivePolicy"])
    assert redrive == {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2}, redrive
    sources = sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"]
    assert sources == [url], sources
    # In the query protocol's XML, each is a <QueueUrl>, as SDKs read it.
    import urllib.parse

    form = {"Action": "ListDeadLetterSourceQueues", "Version": "2012-11-05", "QueueUrl": dlq}
    headers = {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"}
    status, _, answer = signed_post(urllib.parse.urlencode(form).encode(), headers)
    assert status == 200 and f"<QueueUrl>{url}</QueueUrl>".encode() in answer, answer
    missing = json.dumps(
        {"deadLetterTargetArn": dlq_arn.replace("boto-dlq", "nope"), "maxReceiveCount": 2}
    )
    code = error_code(
        lambda: sqs.set_queue_attributes(QueueUrl=url, Attributes={"RedrivePolicy": missing})
    )
    assert code == "InvalidParameterValue", code

    sqs.send_message(QueueUrl=url, MessageBody="poison", MessageAttributes=priority(4))
    for receive in [1, 2]:
        [m] = receive_all(url, 1, AttributeNames=["ApproximateReceiveCount"])
        assert m["Attributes"]["ApproximateReceiveCount"] == str(receive), m
        sqs.change_message_visibility(
            QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
        )
    [dead] = receive_all(dlq, 1, MessageAttributeNames=["All"])
    assert dead["Body"] == "poison", dead
    assert dead["MessageAttributes"]["Priority"]["StringValue"] == "4", dead
    empty = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)
    assert "Messages" not in empty, empty
    # Back to the source with a move task, once visible again in the DLQ.
    sqs.change_message_visibility(
        QueueUrl=dlq, ReceiptHandle=dead["ReceiptHandle"], VisibilityTimeout=0
    )
    handle = sqs.start_message_move_task(SourceArn=dlq_arn)["TaskHandle"]
    # AWS's form of a handle: base64 of the task id and source ARN as JSON.
    assert json.loads(base64.b64decode(handle))["sourceArn"] == dlq_arn, handle
    # The task runs after the answer; listed with its handle while it runs, without once done.
    deadline = time.monotonic() + 30
    while True:
        [task] = sqs.list_message_move_tasks(SourceArn=dlq_arn)["Results"]
        if task["Status"] != "RUNNING" or time.monotonic() > deadline:
            break
        assert task["TaskHandle"] == handle, task
        time.sleep(0.05)
    assert task["Status"] == "COMPLETED" and "TaskHandle" not in task, task
    assert task["ApproximateNumberOfMessagesMoved"] == 1, task
    assert task["ApproximateNumberOfMessagesToMove"] == 1, task
    [back] = receive_all(url, 1, AttributeNames=["ApproximateReceiveCount"])
    assert back["Body"] == "poison" and back["MessageId"] == dead["MessageId"], back
    assert back["Attributes"]["ApproximateReceiveCount"] == "1", back
    delete_all(url, [back])
    code = error_code(lambda: sqs.start_message_move_task(SourceArn=dlq_arn.replace("dlq", "redriven")))
    assert code == "InvalidParameterValue", code
    # Deleting the dead-letter queue takes the source's redrive policy with it: no policy is
    # left naming a queue that is gone.
    sqs.delete_queue(QueueUrl=dlq)
    left = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert "RedrivePolicy" not in left, left
    sqs.send_message(QueueUrl=url, MessageBody="kept", MessageAttributes=priority(4))
    for receive in [1, 2, 3]:
        [m] = receive_all(url, 1, AttributeNames=["ApproximateReceiveCount"])
        assert m["Body"] == "kept" and m["Attributes"]["ApproximateReceiveCount"] == str(receive), m
        sqs.change_message_visibility(
            QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
        )
    [m] = receive_all(url, 1)
    delete_all(url, [m])


def queues_are_the_tree_s_and_every_gateway_sees_them():
    """With SECOND_ENDPOINT: another gateway in front of the same tree."""
    second = boto3.client(
        "sqs",
        endpoint_url=os.environ["SECOND_ENDPOINT"],
        region_name="us-east-1",
        aws_access_key_id=KEY,
        aws_secret_access_key=SECRET,
        config=Config(retries=RETRIES),
    )
    url = sqs.create_queue(QueueName="boto-shared", Attributes={"DelaySeconds": "0"})[
        "QueueUrl"
    ]
    found = second.get_queue_url(QueueName="boto-shared")["QueueUrl"]
    assert found.rsplit("/", 2)[1:] == url.rsplit("/", 2)[1:], (found, url)
    second.set_queue_attributes(QueueUrl=found, Attributes={"VisibilityTimeout": "9"})
    deadline = time.time() + 10
    while True:
        attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])
        if attributes["Attributes"]["VisibilityTimeout"] == "9":
            break
        assert time.time() < deadline, attributes
        time.sleep(0.2)


def messages_come_out_most_urgent_first_with_their_digests():
    url = sqs.create_queue(QueueName="boto-order")["QueueUrl"]
    sent = {}
    for p in [5, 1, 3, 0, 4, 2]:
        body = f"priority {p} é"
        answer = sqs.send_message(QueueUrl=url, MessageBody=body, MessageAttributes=priority(p))
        assert answer["MD5OfMessageBody"] == hashlib.md5(body.encode()).hexdigest()
        assert answer["MD5OfMessageAttributes"] == md5_of_attributes(priority(p))
        sent[answer["MessageId"]] = p
    got = receive_all(url, 6, MessageAttributeNames=["All"], AttributeNames=["All"])
    priorities = [int(m["MessageAttributes"]["Priority"]["StringValue"]) for m in got]
    assert priorities == sorted(priorities) == [0, 1, 2, 3, 4, 5], priorities
    for m in got:
        assert sent[m["MessageId"]] == int(m["MessageAttributes"]["Priority"]["StringValue"])
        assert m["MD5OfBody"] == hashlib.md5(m["Body"].encode()).hexdigest()
        assert m["MD5OfMessageAttributes"] == md5_of_attributes(m["MessageAttributes"])
        assert m["Attributes"]["ApproximateReceiveCount"] == "1", m["Attributes"]
        sent_at = int(m["Attributes"]["SentTimestamp"])
        assert abs(sent_at / 1000 - time.time()) < 60, sent_at
        assert m["Attributes"]["SenderId"] == KEY
        # A UUID, as SQS's ids are: usable as a batch entry's id.
        assert str(uuid.UUID(m["MessageId"])) == m["MessageId"], m["MessageId"]
    answer = sqs.delete_message_batch(
        QueueUrl=url,
        Entries=[{"Id": m["MessageId"], "ReceiptHandle": m["ReceiptHandle"]} for m in got],
    )
    assert sorted(e["Id"] for e in answer["Successful"]) == sorted(sent), answer


def attributes_of_every_type_round_trip():
    url = sqs.create_queue(QueueName="boto-attributes")["QueueUrl"]
    attributes = {
        "text": {"DataType": "String", "StringValue": "hello"},
        "count": {"DataType": "Number.int", "StringValue": "42"},
        "blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xff"},
        "trace.id": {"DataType": "String", "StringValue": "abc"},
        "attr.1øßä": {"DataType": "String", "StringValue": "letters of any script"},
    }
    answer = sqs.send_message(QueueUrl=url, MessageBody="x", MessageAttributes=attributes)
    assert answer["MD5OfMessageAttributes"] == md5_of_attributes(attributes)
    [m] = receive_all(
        url, 1, MessageAttributeNames=["trace.*", "blob", "count", "text", "attr.1øßä"]
    )
    got = m["MessageAttributes"]
    assert got["attr.1øßä"]["StringValue"] == "letters of any script", got
    assert got["blob"]["BinaryValue"] == b"\x00\x01\xff", got
    assert got["count"] == {"DataType": "Number.int", "StringValue": "42"}, got
    assert got["trace.id"]["StringValue"] == "abc"
    assert "Priority" not in got, "not asked for"
    assert m["MD5OfMessageAttributes"] == md5_of_attributes(got)
    delete_all(url, [m])
    # The system attribute AWSTraceHeader: kept apart from the message attributes (their MD5
    # unchanged; its own MD5 as AWS gives it), given back when asked for; or taken from the
    # request's X-Amzn-Trace-Id.
    trace = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
    stamp = {"timestamp": {"StringValue": "1493147359900", "DataType": "Number"}}
    plain = sqs.send_message(QueueUrl=url, MessageBody="t", MessageAttributes=stamp)
    traced = sqs.send_message(
        QueueUrl=url,
        MessageBody="t",
        MessageAttributes=stamp,
        MessageSystemAttributes={"AWSTraceHeader": {"DataType": "String", "StringValue": trace}},
    )
    assert traced["MD5OfMessageAttributes"] == plain["MD5OfMessageAttributes"], traced
    assert "MD5OfMessageSystemAttributes" not in plain, plain
    assert traced["MD5OfMessageSystemAttributes"] == "5ae4d5d7636402d80f4eb6d213245a88", traced
    got = receive_all(url, 2, AttributeNames=["AWSTraceHeader"])
    assert sorted(m.get("Attributes", {}).get("AWSTraceHeader", "") for m in got) == ["", trace]
    delete_all(url, got)
    header = "Root=1-3152b799-8954dae64eda91bc9a23a7e8;Parent=7fa8c0f79203be72;Sampled=1"
    xray = client()
    xray.meta.events.register(
        "before-send.sqs.SendMessage",
        lambda request, **_: request.headers.__setitem__("X-Amzn-Trace-Id", header),
    )
    xray.send_message(QueueUrl=url, MessageBody="x-ray")
    [m] = receive_all(url, 1, AttributeNames=["All"])
    assert m["Attributes"]["AWSTraceHeader"] == header, m
    delete_all(url, [m])
    # Empty values, names outside letters, digits and _-., and values with control
    # characters are refused, as SQS refuses them.
    empty = {"ErrorDetails": {"DataType": "String", "StringValue": ""}}
    try:
        sqs.send_message(QueueUrl=url, MessageBody="x", MessageAttributes=empty)
        raise AssertionError("an empty attribute was taken")
    except botocore.exceptions.ClientError as error:
        assert error.response["Error"]["Message"] == (
            "Message (user) attribute 'ErrorDetails' must contain a non-empty value of type "
            "'String'."
        ), error.response
    for bad in [
        {"Invalid-§-attr": {"DataType": "String", "StringValue": "v"}},
        {"attr1": {"DataType": "String", "StringValue": f"Invalid-{chr(8)},{chr(11)}"}},
    ]:
        code = error_code(
            lambda: sqs.send_message(QueueUrl=url, MessageBody="x", MessageAttributes=bad)
        )
        assert code == "InvalidParameterValue", (bad, code)
    # Sent without attributes: none come back, though all are asked for (no Priority).
    sqs.send_message(QueueUrl=url, MessageBody="plain")
    [m] = receive_all(url, 1, MessageAttributeNames=["All"])
    assert "MessageAttributes" not in m, m
    assert "MD5OfMessageAttributes" not in m, m
    delete_all(url, [m])


def visibility_timeouts_and_their_changes():
    url = sqs.create_queue(QueueName="boto-visibility")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="again")
    [first] = receive_all(url, 1, VisibilityTimeout=1, AttributeNames=["ApproximateReceiveCount"])
    # Not deleted: visible again once its second is over (the long poll waits for it).
    [second] = receive_all(url, 1, AttributeNames=["ApproximateReceiveCount"])
    assert second["MessageId"] == first["MessageId"]
    assert second["Attributes"]["ApproximateReceiveCount"] == "2", second["Attributes"]
    # The first receipt is stale now: deleting with it succeeds, as on SQS, and deletes
    # nothing (the message stays leased to the second receipt).
    sqs.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])
    assert "Messages" not in sqs.receive_message(QueueUrl=url, VisibilityTimeout=1)
    # Extended: not visible for a while; given back (0): visible at once.
    sqs.change_message_visibility(
        QueueUrl=url, ReceiptHandle=second["ReceiptHandle"], VisibilityTimeout=60
    )
    hidden = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1, AttributeNames=["All"])
    assert "Messages" not in hidden, (hidden, second)
    sqs.change_message_visibility(
        QueueUrl=url, ReceiptHandle=second["ReceiptHandle"], VisibilityTimeout=0
    )
    [third] = receive_all(url, 1)
    assert third["MessageId"] == first["MessageId"]
    answer = sqs.change_message_visibility_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "ok", "ReceiptHandle": third["ReceiptHandle"], "VisibilityTimeout": 30},
            {"Id": "bad", "ReceiptHandle": "not-a-handle", "VisibilityTimeout": 30},
        ],
    )
    assert [e["Id"] for e in answer["Successful"]] == ["ok"], answer
    assert answer["Failed"][0]["Code"] == "ReceiptHandleIsInvalid", answer
    sqs.delete_message(QueueUrl=url, ReceiptHandle=third["ReceiptHandle"])
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)
    # Deleted already: the same delete again succeeds.
    sqs.delete_message(QueueUrl=url, ReceiptHandle=third["ReceiptHandle"])
    code = error_code(lambda: sqs.delete_message(QueueUrl=url, ReceiptHandle="junk"))
    assert code == "ReceiptHandleIsInvalid", code


def pops_waiting_at_the_root():
    """The root's waiting pops, from its /metrics (ROOT_HTTP: the root's HTTP address)."""
    with urllib.request.urlopen(f"http://{os.environ['ROOT_HTTP']}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return sum(
        float(line.split()[-1]) for line in text.splitlines() if line.startswith("crest_pending_pops")
    )


def a_long_poll_wakes_up_when_a_message_arrives():
    url = sqs.create_queue(QueueName="boto-long-poll")["QueueUrl"]
    result = {}

    def wait():
        started = time.time()
        result["answer"] = client().receive_message(QueueUrl=url, WaitTimeSeconds=20)
        result["waited"] = time.time() - started

    waiter = threading.Thread(target=wait)
    waiter.start()
    # Sent once the receive waits at the root: woken, not served at once.
    deadline = time.time() + 10
    while pops_waiting_at_the_root() < 1:
        assert time.time() < deadline, "the receive never waited at the root"
        time.sleep(0.02)
    sqs.send_message(QueueUrl=url, MessageBody="wake up")
    waiter.join(30)
    messages = result["answer"].get("Messages", [])
    assert [m["Body"] for m in messages] == ["wake up"], result
    # Woken by the message: had nothing woken it, it would have come back when its 20 s ran
    # out, with whatever had come by then.
    assert result["waited"] < 19, result
    delete_all(url, messages)


def a_batch_answers_each_entry_and_refuses_only_the_bad_one():
    url = sqs.create_queue(QueueName="boto-batch")["QueueUrl"]
    entries = [
        {"Id": f"m{i}", "MessageBody": f"body {i}", "MessageAttributes": priority(i % 3)}
        for i in range(10)
    ]
    entries[4]["MessageAttributes"] = {"Priority": {"DataType": "String", "StringValue": "high"}}
    answer = sqs.send_message_batch(QueueUrl=url, Entries=entries)
    assert sorted(e["Id"] for e in answer["Successful"]) == sorted(
        f"m{i}" for i in range(10) if i != 4
    ), answer
    [failure] = answer["Failed"]
    assert failure["Id"] == "m4" and failure["SenderFault"], failure
    assert failure["Code"] == "InvalidParameterValue", failure
    for e in answer["Successful"]:
        body = entries[int(e["Id"][1:])]["MessageBody"]
        assert e["MD5OfMessageBody"] == hashlib.md5(body.encode()).hexdigest()
    got = receive_all(url, 9)
    assert sorted(m["Body"] for m in got) == sorted(f"body {i}" for i in range(10) if i != 4)
    delete_all(url, got)
    too_many = [{"Id": f"m{i}", "MessageBody": "x"} for i in range(11)]
    try:
        sqs.send_message_batch(QueueUrl=url, Entries=too_many)
        raise AssertionError("11 entries accepted")
    except sqs.exceptions.TooManyEntriesInBatchRequest:
        pass
    code = error_code(
        lambda: sqs.send_message_batch(
            QueueUrl=url,
            Entries=[{"Id": "a", "MessageBody": "x"}, {"Id": "a", "MessageBody": "y"}],
        )
    )
    assert code == "AWS.SimpleQueueService.BatchEntryIdsNotDistinct", code


def dedup_ids_send_once_and_group_ids_come_back():
    url = sqs.create_queue(QueueName="boto-dedup")["QueueUrl"]
    first = sqs.send_message(
        QueueUrl=url, MessageBody="once", MessageDeduplicationId="order-7", MessageGroupId="t-42"
    )["MessageId"]
    again = sqs.send_message(QueueUrl=url, MessageBody="once", MessageDeduplicationId="order-7")
    assert again["MessageId"] == first, (again, first)
    [m] = receive_all(url, 1, AttributeNames=["All"])
    assert m["MessageId"] == first and m["Attributes"]["MessageGroupId"] == "t-42", m
    delete_all(url, [m])
    empty = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)
    assert "Messages" not in empty, "sent once"
    code = error_code(
        lambda: sqs.send_message(QueueUrl=url, MessageBody="x", MessageDeduplicationId="a b")
    )
    assert code == "InvalidParameterValue", code


def message_groups_of_a_fair_queue_share_it():
    """boto-fair's topic is weighted (the test's topology): its message groups are fairness
    keys, so a group with a deep backlog cannot starve the others."""
    url = sqs.create_queue(QueueName="boto-fair")["QueueUrl"]
    for batch in range(3):
        entries = [
            {"Id": f"n{i}", "MessageBody": f"noisy {batch}.{i}", "MessageGroupId": "noisy"}
            for i in range(10)
        ]
        assert len(sqs.send_message_batch(QueueUrl=url, Entries=entries)["Successful"]) == 10
    for group in ["quiet-1", "quiet-2"]:
        for i in range(3):
            sqs.send_message(QueueUrl=url, MessageBody=f"{group} {i}", MessageGroupId=group)
    # One at a time, deleted: in the key order the six quiet messages would come last
    # (31st to 36th); groups taking turns, all of them come within the first twelve.
    order = []
    deadline = time.time() + 20
    while len(order) < 36 and time.time() < deadline:
        answer = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=1, WaitTimeSeconds=2, AttributeNames=["All"]
        )
        for m in answer.get("Messages", []):
            order.append(m["Attributes"]["MessageGroupId"])
            delete_all(url, [m])
    assert len(order) == 36, f"received {len(order)} of 36"
    quiet = [at for at, group in enumerate(order) if group != "noisy"]
    assert len(quiet) == 6 and quiet[-1] < 12, order


def depths_show_in_the_queue_s_attributes():
    url = sqs.create_queue(QueueName="boto-depth")["QueueUrl"]
    for i in range(3):
        sqs.send_message(QueueUrl=url, MessageBody=str(i))
    deadline = time.time() + 20
    while True:
        attributes = sqs.get_queue_attributes(
            QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]
        if attributes["ApproximateNumberOfMessages"] == "3":
            break
        assert time.time() < deadline, attributes
        time.sleep(0.2)
    delete_all(url, receive_all(url, 3))


def a_purge_empties_the_queue_but_leaves_received_messages_to_their_receipts():
    url = sqs.create_queue(QueueName="boto-purge")["QueueUrl"]
    other = sqs.create_queue(QueueName="boto-purge-other")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="held", MessageAttributes=priority(0))
    [held] = receive_all(url, 1, VisibilityTimeout=60)
    for i in range(25):
        sqs.send_message(QueueUrl=url, MessageBody=f"ready {i}")
    sqs.send_message(QueueUrl=url, MessageBody="delayed", DelaySeconds=30)
    sqs.send_message(QueueUrl=other, MessageBody="elsewhere")
    sqs.purge_queue(QueueUrl=url)
    # One purge a minute, as SQS allows.
    code = error_code(lambda: sqs.purge_queue(QueueUrl=url))
    assert code == "AWS.SimpleQueueService.PurgeQueueInProgress", code
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    depths = [
        attributes[name]
        for name in [
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesDelayed",
            "ApproximateNumberOfMessagesNotVisible",
        ]
    ]
    assert depths == ["0", "0", "1"], attributes
    empty = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
    assert "Messages" not in empty, empty
    delete_all(url, [held])
    [m] = receive_all(other, 1)
    assert m["Body"] == "elsewhere", m
    delete_all(other, [m])
    missing = f"{url}-gone"
    code = error_code(lambda: sqs.purge_queue(QueueUrl=missing))
    assert code == "AWS.SimpleQueueService.NonExistentQueue", code


def errors_read_as_aws_writes_them():
    """Codes, shapes (botocore's QueryErrorCode, from the JSON protocol's __type) and
    messages as AWS answers them (LocalStack's snapshots recorded on AWS)."""
    url = sqs.create_queue(QueueName="boto-errors")["QueueUrl"]

    def refusal(call):
        try:
            call()
        except botocore.exceptions.ClientError as error:
            return error.response["Error"]
        raise AssertionError("the call succeeded")

    error = refusal(lambda: sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=11))
    assert error["Code"] == "InvalidParameterValue", error
    assert error["QueryErrorCode"] == "InvalidParameterValueException", error
    assert error["Message"] == (
        "Value 11 for parameter MaxNumberOfMessages is invalid. Reason: Must be between 1 and "
        "10, if provided."
    ), error
    error = refusal(lambda: sqs.receive_message(QueueUrl=url, WaitTimeSeconds=21))
    assert error["Message"] == (
        "Value 21 for parameter WaitTimeSeconds is invalid. Reason: Must be >= 0 and <= 20, if "
        "provided."
    ), error
    error = refusal(lambda: sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "bad id", "MessageBody": "x"}]))
    assert error["Code"] == "AWS.SimpleQueueService.InvalidBatchEntryId", error
    assert error["Message"] == (
        "A batch entry id can only contain alphanumeric characters, hyphens and underscores. It "
        "can be at most 80 letters long."
    ), error
    raw = client(validate=False)
    error = refusal(lambda: raw.send_message(QueueUrl=url))
    assert error["Code"] == "MissingParameter", error
    assert error["QueryErrorCode"] == "MissingRequiredParameterException", error
    assert error["Message"] == "The request must contain the parameter MessageBody.", error


def messages_up_to_a_mebibyte_counting_their_attributes():
    """SQS's sizes since 2025: a message (body and attributes) up to 1 MiB, a batch too."""
    url = sqs.create_queue(QueueName="boto-sizes")["QueueUrl"]
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["MaximumMessageSize"])
    assert attributes["Attributes"]["MaximumMessageSize"] == "1048576", attributes
    mib = 1_048_576
    sqs.send_message(QueueUrl=url, MessageBody="m" * mib)
    [m] = receive_all(url, 1)
    assert len(m["Body"]) == mib, len(m["Body"])
    delete_all(url, [m])
    # The attributes count: a full body with one more attribute is too long.
    extra = {"k": {"DataType": "String", "StringValue": "v"}}
    try:
        sqs.send_message(QueueUrl=url, MessageBody="m" * (mib - 7), MessageAttributes=extra)
        raise AssertionError("a message over 1 MiB was taken")
    except botocore.exceptions.ClientError as error:
        assert error.response["Error"]["Message"] == (
            "One or more parameters are invalid. Reason: Message must be shorter than 1048576 "
            "bytes."
        ), error.response
    entries = [
        {"Id": "a", "MessageBody": "a" * (mib // 2)},
        {"Id": "b", "MessageBody": "b" * (mib // 2 + 1)},
    ]
    try:
        sqs.send_message_batch(QueueUrl=url, Entries=entries)
        raise AssertionError("a batch over 1 MiB was taken")
    except botocore.exceptions.ClientError as error:
        refusal = error.response["Error"]
        assert refusal["Code"] == "AWS.SimpleQueueService.BatchRequestTooLong", refusal
        assert refusal["Message"] == (
            "Batch requests cannot be longer than 1048576 bytes. You have sent 1048577 bytes."
        ), refusal


def each_region_has_its_own_queues():
    """As on SQS: the same name in two regions is two queues; a client sees its region's."""
    away = client(region="eu-central-1")
    here_url = sqs.create_queue(QueueName="boto-regional")["QueueUrl"]
    away_url = away.create_queue(QueueName="boto-regional")["QueueUrl"]
    assert here_url != away_url and "eu-central-1" in away_url, (here_url, away_url)
    assert sqs.get_queue_url(QueueName="boto-regional")["QueueUrl"] == here_url
    assert away.get_queue_url(QueueName="boto-regional")["QueueUrl"] == away_url
    here_list = sqs.list_queues(QueueNamePrefix="boto-regional").get("QueueUrls", [])
    away_list = away.list_queues(QueueNamePrefix="boto-regional").get("QueueUrls", [])
    assert here_list == [here_url] and away_list == [away_url], (here_list, away_list)
    away.send_message(QueueUrl="boto-regional", MessageBody="in eu-central-1")
    empty = sqs.receive_message(QueueUrl=here_url, WaitTimeSeconds=1)
    assert "Messages" not in empty, empty
    [m] = receive_all(away_url, 1)
    assert m["Body"] == "in eu-central-1", m
    arn = away.get_queue_attributes(QueueUrl=away_url, AttributeNames=["QueueArn"])
    assert arn["Attributes"]["QueueArn"].startswith("arn:aws:sqs:eu-central-1:"), arn
    away.delete_message(QueueUrl=away_url, ReceiptHandle=m["ReceiptHandle"])
    away.delete_queue(QueueUrl=away_url)
    assert sqs.get_queue_url(QueueName="boto-regional")["QueueUrl"] == here_url


def bad_signatures_and_unknown_keys_are_refused():
    url = sqs.create_queue(QueueName="boto-signed")["QueueUrl"]
    code = error_code(lambda: client(secret="wrong" + SECRET[5:]).list_queues())
    assert code == "SignatureDoesNotMatch", code
    code = error_code(lambda: client(key="AKIAUNKNOWN000000000").list_queues())
    assert code == "InvalidClientTokenId", code
    code = error_code(
        lambda: client(secret="x").send_message(QueueUrl=url, MessageBody="never")
    )
    assert code == "SignatureDoesNotMatch", code


def post(body, headers):
    import urllib.error
    import urllib.request

    request = urllib.request.Request(ENDPOINT + "/", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def signed_post(body, headers):
    """POSTs `body` with `headers`, signed with SigV4 as botocore signs."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    request = AWSRequest(method="POST", url=ENDPOINT + "/", data=body, headers=headers)
    SigV4Auth(Credentials(KEY, SECRET), "sqs", "us-east-1").add_auth(request)
    return post(body, dict(request.headers.items()))


def unsigned_and_malformed_requests_get_typed_errors():
    def signed(body, target):
        headers = {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": target}
        return signed_post(body, headers)

    status, headers, body = post(b"{}", {"X-Amz-Target": "AmazonSQS.ListQueues"})
    assert status == 403, (status, body)
    assert headers["x-amzn-query-error"] == "MissingAuthenticationToken;Sender", headers
    assert json.loads(body)["__type"].endswith("#MissingAuthenticationToken"), body
    status, headers, body = signed(b"{not json", "AmazonSQS.ListQueues")
    assert status == 400 and b"not JSON" in body, (status, body)
    status, headers, body = signed(b"[1]", "AmazonSQS.ListQueues")
    assert status == 400 and headers["x-amzn-query-error"].startswith("InvalidParameterValue")
    status, headers, body = signed(b"{}", "AmazonSQS.NoSuchAction")
    assert status == 400 and headers["x-amzn-query-error"].startswith("InvalidAction"), body
    status, headers, body = signed(b"{}", "AmazonSQS.SendMessage")
    assert headers["x-amzn-query-error"].startswith("MissingParameter"), body
    # Bodies over the gateway's bound are refused before they are read whole.
    status, _, _ = signed(b"{" + b" " * (5 << 20) + b"}", "AmazonSQS.ListQueues")
    assert status == 413, status


def the_query_protocol_answers_in_xml():
    """Older SDKs' form-encoded requests, as SQS's documentation writes them."""
    import urllib.parse
    import xml.etree.ElementTree as ET

    ns = {"sqs": "http://queue.amazonaws.com/doc/2012-11-05/"}

    def call(action, **params):
        body = urllib.parse.urlencode({"Action": action, "Version": "2012-11-05", **params})
        headers = {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"}
        status, _, answer = signed_post(body.encode(), headers)
        return status, ET.fromstring(answer)

    status, root = call("CreateQueue", QueueName="query-jobs", **{
        "Attribute.1.Name": "VisibilityTimeout", "Attribute.1.Value": "40"})
    assert status == 200, ET.tostring(root)
    url = root.find("sqs:CreateQueueResult/sqs:QueueUrl", ns).text
    assert url.endswith("/default/query-jobs"), url
    for p in [2, 0]:
        status, root = call("SendMessage", QueueUrl=url, MessageBody=f"query {p} <&>", **{
            "MessageAttribute.1.Name": "Priority",
            "MessageAttribute.1.Value.DataType": "Number",
            "MessageAttribute.1.Value.StringValue": str(p)})
        assert status == 200, ET.tostring(root)
        md5 = root.find("sqs:SendMessageResult/sqs:MD5OfMessageBody", ns).text
        assert md5 == hashlib.md5(f"query {p} <&>".encode()).hexdigest()
    status, root = call("SendMessageBatch", QueueUrl=url, **{
        "SendMessageBatchRequestEntry.1.Id": "a", "SendMessageBatchRequestEntry.1.MessageBody": "b1",
        "SendMessageBatchRequestEntry.2.Id": "b", "SendMessageBatchRequestEntry.2.MessageBody": ""})
    entries = root.findall("sqs:SendMessageBatchResult/sqs:SendMessageBatchResultEntry", ns)
    failed = root.findall("sqs:SendMessageBatchResult/sqs:BatchResultErrorEntry", ns)
    assert [e.find("sqs:Id", ns).text for e in entries] == ["a"], ET.tostring(root)
    assert failed[0].find("sqs:Code", ns).text == "MissingParameter", ET.tostring(root)
    got = []
    deadline = time.time() + 20
    while len(got) < 3 and time.time() < deadline:
        status, root = call("ReceiveMessage", QueueUrl=url, MaxNumberOfMessages="10",
                            WaitTimeSeconds="2", **{"AttributeName.1": "All",
                                                    "MessageAttributeName.1": "All"})
        got += root.findall("sqs:ReceiveMessageResult/sqs:Message", ns)
    bodies = [m.find("sqs:Body", ns).text for m in got]
    assert bodies[:2] == ["query 0 <&>", "query 2 <&>"], bodies
    first = got[0]
    assert first.find("sqs:Attribute[sqs:Name='ApproximateReceiveCount']/sqs:Value", ns).text == "1"
    priority_value = first.find(
        "sqs:MessageAttribute[sqs:Name='Priority']/sqs:Value/sqs:StringValue", ns).text
    assert priority_value == "0", ET.tostring(first)
    for i, m in enumerate(got):
        status, root = call("DeleteMessage", QueueUrl=url,
                            ReceiptHandle=m.find("sqs:ReceiptHandle", ns).text)
        assert status == 200, ET.tostring(root)
    status, root = call("TagQueue", QueueUrl=url, **{"Tag.1.Key": "k", "Tag.1.Value": "v"})
    assert status == 200, ET.tostring(root)
    status, root = call("ListQueueTags", QueueUrl=url)
    tag = root.find("sqs:ListQueueTagsResult/sqs:Tag", ns)
    assert (tag.find("sqs:Key", ns).text, tag.find("sqs:Value", ns).text) == ("k", "v"), (
        ET.tostring(root)
    )
    status, root = call("UntagQueue", QueueUrl=url, **{"TagKey.1": "k"})
    assert status == 200, ET.tostring(root)
    status, root = call("ListQueueTags", QueueUrl=url)
    assert root.find("sqs:ListQueueTagsResult/sqs:Tag", ns) is None, ET.tostring(root)
    status, root = call("GetQueueUrl", QueueName="no-such-queue")
    assert status == 400, status
    assert root.find("sqs:Error/sqs:Code", ns).text == "AWS.SimpleQueueService.NonExistentQueue"
    assert root.find("sqs:Error/sqs:Type", ns).text == "Sender"
    status, root = call("NoSuchAction")
    assert root.find("sqs:Error/sqs:Code", ns).text == "InvalidAction", ET.tostring(root)

    # Presigned: a GET signed in its query string (botocore's SigV4QueryAuth, as SDKs'
    # presigners sign), to the queue's URL, which names the queue without a QueueUrl.
    def presigned_get(url, params, expires=300, at=None):
        import botocore.auth
        import botocore.awsrequest
        import botocore.credentials

        request = botocore.awsrequest.AWSRequest(method="GET", url=url, params=params)
        signer = botocore.auth.SigV4QueryAuth(
            botocore.credentials.Credentials(KEY, SECRET), "sqs", "us-east-1", expires=expires
        )
        if at is None:
            signer.add_auth(request)
        else:
            import unittest.mock

            with unittest.mock.patch("botocore.auth.get_current_datetime", return_value=at):
                signer.add_auth(request)
        prepared = request.prepare()
        try:
            with urllib.request.urlopen(prepared.url) as answer:
                return answer.status, ET.fromstring(answer.read())
        except urllib.error.HTTPError as error:
            return error.code, ET.fromstring(error.read())

    status, root = presigned_get(url, {"Action": "GetQueueAttributes", "AttributeName.1": "All"})
    assert status == 200, ET.tostring(root)
    value = root.find(
        "sqs:GetQueueAttributesResult/sqs:Attribute[sqs:Name='VisibilityTimeout']/sqs:Value", ns)
    assert value.text == "40", ET.tostring(root)
    status, root = presigned_get(ENDPOINT + "/", {"Action": "ListQueues"})
    assert status == 200, ET.tostring(root)
    # Dated two hours ago, valid for one: expired.
    import datetime

    old = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None) - datetime.timedelta(
        hours=2
    )
    status, root = presigned_get(ENDPOINT + "/", {"Action": "ListQueues"}, expires=3600, at=old)
    assert status == 400, status
    assert root.find("sqs:Error/sqs:Code", ns).text == "RequestExpired", ET.tostring(root)


def the_aws_cli_sends_receives_and_deletes():
    aws = os.path.join(os.path.dirname(sys.executable), "aws")
    env = dict(os.environ, AWS_DEFAULT_REGION="us-east-1")
    base = [aws, "--endpoint-url", ENDPOINT, "--output", "json", "sqs"]

    def run(*args):
        out = subprocess.run(base + list(args), env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout) if out.stdout.strip() else {}

    url = run("create-queue", "--queue-name", "cli-jobs")["QueueUrl"]
    for p in [3, 1, 2]:
        run(
            "send-message", "--queue-url", url, "--message-body", f"cli {p}",
            "--message-attributes", json.dumps(priority(p)),
        )
    got = []
    deadline = time.time() + 20
    while len(got) < 3 and time.time() < deadline:
        got += run(
            "receive-message", "--queue-url", url, "--max-number-of-messages", "10",
            "--wait-time-seconds", "2",
        ).get("Messages", [])
    assert [m["Body"] for m in got] == ["cli 1", "cli 2", "cli 3"], got
    for m in got:
        run("delete-message", "--queue-url", url, "--receipt-handle", m["ReceiptHandle"])


def keys_act_in_their_namespace_with_their_principal_s_permissions():
    """With OTHER_KEY (namespace `orders`, a principal that may produce there and manage its
    queues, but not consume) and READER_KEY (`orders`, consume only), and their secrets."""
    other = client(os.environ["OTHER_KEY"], os.environ["OTHER_SECRET"])
    url = other.create_queue(QueueName="eu-jobs")["QueueUrl"]
    assert url.endswith("/orders/eu-jobs"), url
    assert url not in sqs.list_queues().get("QueueUrls", []), "another namespace's queue"
    assert url in other.list_queues()["QueueUrls"]
    other.send_message(QueueUrl=url, MessageBody="allowed", MessageAttributes=priority(1))
    code = error_code(lambda: other.receive_message(QueueUrl=url))
    assert code == "AccessDenied", code
    # A key without `admin` finds the queue, may not create another nor change this one.
    reader = client(os.environ["READER_KEY"], os.environ["READER_SECRET"])
    assert reader.create_queue(QueueName="eu-jobs")["QueueUrl"] == url, "it exists: found"
    code = error_code(lambda: reader.create_queue(QueueName="eu-new"))
    assert code == "AccessDenied", code
    code = error_code(
        lambda: reader.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "1"})
    )
    assert code == "AccessDenied", code
    # The admin key (every permission) takes it out of topic orders/eu-jobs.
    [m] = receive_all(url, 1)
    assert m["Body"] == "allowed"
    delete_all(url, [m])


CHECKS = [
    queues_are_created_found_listed_and_checked,
    messages_come_out_most_urgent_first_with_their_digests,
    attributes_of_every_type_round_trip,
    visibility_timeouts_and_their_changes,
    a_long_poll_wakes_up_when_a_message_arrives,
    a_batch_answers_each_entry_and_refuses_only_the_bad_one,
    dedup_ids_send_once_and_group_ids_come_back,
    message_groups_of_a_fair_queue_share_it,
    depths_show_in_the_queue_s_attributes,
    redrive_sends_a_message_out_of_receives_to_its_dead_letter_queue_and_back,
    a_purge_empties_the_queue_but_leaves_received_messages_to_their_receipts,
    errors_read_as_aws_writes_them,
    messages_up_to_a_mebibyte_counting_their_attributes,
    each_region_has_its_own_queues,
    bad_signatures_and_unknown_keys_are_refused,
    unsigned_and_malformed_requests_get_typed_errors,
    the_query_protocol_answers_in_xml,
    the_aws_cli_sends_receives_and_deletes,
]

if __name__ == "__main__":
    print(f"boto3 {boto3.__version__} against {ENDPOINT}")
    names = sys.argv[1:]
    everything = CHECKS + [
        keys_act_in_their_namespace_with_their_principal_s_permissions,
        queues_are_the_tree_s_and_every_gateway_sees_them,
    ]
    chosen = [c for c in everything if c.__name__ in names] if names else CHECKS
    assert len(chosen) == len(names or CHECKS), f"unknown checks in {names}"
    CHECKS = chosen
    for check in CHECKS:
        started = time.time()
        check()
        print(f"ok  {check.__name__} ({time.time() - started:.1f} s)")
    print(f"passed all {len(CHECKS)} checks")
