-- acemq inbox: the (queue, message id) pairs a consumer has processed.
CREATE TABLE IF NOT EXISTS acemq_inbox (
    queue        text        NOT NULL,
    message_id   text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, message_id)
);
CREATE INDEX IF NOT EXISTS acemq_inbox_processed_at ON acemq_inbox (processed_at);
