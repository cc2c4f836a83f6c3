-- acemq outbox: messages written in the user's transaction, published by the relay.
CREATE TABLE IF NOT EXISTS acemq_outbox (
    id               bigserial   PRIMARY KEY,
    -- Set on every published message (AMQP message-id): a consumer's inbox
    -- recognises the rare duplicate after a relay crash by it.
    message_id       text        NOT NULL DEFAULT gen_random_uuid()::text,
    exchange         text        NOT NULL,
    routing_key      text        NOT NULL,
    body             bytea       NOT NULL,
    -- AMQP field table, wire encoding (every header type survives).
    headers          bytea,
    content_type     text,
    content_encoding text,
    correlation_id   text,
    reply_to         text,
    expiration       text,
    priority         smallint,
    kind             text,
    app_id           text,
    delivery_mode    smallint    NOT NULL DEFAULT 2,
    -- pending -> sent (confirmed) | failed (returned unroutable: not retried).
    status           text        NOT NULL DEFAULT 'pending'
                                 CHECK (status IN ('pending', 'sent', 'failed')),
    error            text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    sent_at          timestamptz
);
CREATE INDEX IF NOT EXISTS acemq_outbox_pending ON acemq_outbox (id) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS acemq_outbox_sent_at ON acemq_outbox (sent_at) WHERE status = 'sent';
