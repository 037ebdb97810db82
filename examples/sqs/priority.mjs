// Push with priorities and pop them, most urgent first, with the AWS SDK for JavaScript
// against crest's SQS-compatible API (docs/sqs.md). The SDK checks every MD5 crest answers.
//
//   npm install @aws-sdk/client-sqs
//   SQS_ENDPOINT=http://127.0.0.1:9324 AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... \
//     node priority.mjs
import {
  CreateQueueCommand,
  DeleteMessageBatchCommand,
  ReceiveMessageCommand,
  SendMessageBatchCommand,
  SQSClient,
} from "@aws-sdk/client-sqs";

const sqs = new SQSClient({
  endpoint: process.env.SQS_ENDPOINT ?? "http://127.0.0.1:9324",
  region: "us-east-1",
});
const { QueueUrl } = await sqs.send(new CreateQueueCommand({ QueueName: "node-jobs" }));

// Priority is a message attribute: a Number, lower is more urgent.
const jobs = [
  ["resize thumbnails", 5],
  ["charge card", 0],
  ["send newsletter", 9],
];
await sqs.send(
  new SendMessageBatchCommand({
    QueueUrl,
    Entries: jobs.map(([body, priority], i) => ({
      Id: `m${i}`,
      MessageBody: body,
      MessageAttributes: { Priority: { DataType: "Number", StringValue: String(priority) } },
    })),
  }),
);

let received = 0;
while (received < jobs.length) {
  const { Messages = [] } = await sqs.send(
    new ReceiveMessageCommand({
      QueueUrl,
      MaxNumberOfMessages: 10,
      WaitTimeSeconds: 2,
      MessageAttributeNames: ["Priority"],
    }),
  );
  for (const message of Messages) {
    console.log(`${message.MessageAttributes.Priority.StringValue} ${message.Body}`);
  }
  if (Messages.length > 0) {
    await sqs.send(
      new DeleteMessageBatchCommand({
        QueueUrl,
        Entries: Messages.map((m, i) => ({ Id: `d${i}`, ReceiptHandle: m.ReceiptHandle })),
      }),
    );
  }
  received += Messages.length;
}
