/// Traits required for parsing
pub use crate::types::parsing::traits;
use crate::{
    frame::*,
    protocol::{basic::parse_properties, *},
    types::parsing::*,
};
use nom::{
    Parser,
    bytes::streaming::{tag, take},
    combinator::{all_consuming, flat_map, map, map_opt, map_res},
    error::context,
};
use traits::ParsableInput;

/// Parse a channel id
pub fn parse_channel<I: ParsableInput>(i: I) -> ParserResult<I, AMQPChannel> {
    context("parse_channel", map(parse_id, From::from)).parse(i)
}

/// Parse the protocol header
pub fn parse_protocol_header<I: ParsableInput>(i: I) -> ParserResult<I, ProtocolVersion> {
    context(
        "parse_protocol_header",
        map(
            (
                tag(&metadata::NAME.as_bytes()[1..]),
                tag(&[0][..]),
                parse_short_short_uint,
                parse_short_short_uint,
                parse_short_short_uint,
            ),
            |(_, _, major, minor, revision)| ProtocolVersion {
                major,
                minor,
                revision,
            },
        ),
    )
    .parse(i)
}

/// Parse the frame type
pub fn parse_frame_type<I: ParsableInput>(i: I) -> ParserResult<I, AMQPFrameType> {
    context(
        "parse_frame_type",
        map_opt(parse_short_short_uint, |method| match method {
            c if c == metadata::NAME.as_bytes()[0] => Some(AMQPFrameType::ProtocolHeader),
            constants::FRAME_METHOD => Some(AMQPFrameType::Method),
            constants::FRAME_HEADER => Some(AMQPFrameType::Header),
            constants::FRAME_BODY => Some(AMQPFrameType::Body),
            constants::FRAME_HEARTBEAT => Some(AMQPFrameType::Heartbeat),
            _ => None,
        }),
    )
    .parse(i)
}

/// Parse a full AMQP Frame (with contents)
pub fn parse_frame<I: ParsableInput>(i: I) -> ParserResult<I, AMQPFrame> {
    context(
        "parse_frame",
        flat_map(parse_frame_type, move |frame_type| {
            move |i: I| match frame_type {
                AMQPFrameType::ProtocolHeader => {
                    map(parse_protocol_header, AMQPFrame::ProtocolHeader).parse(i)
                }
                frame_type => map_res(
                    parse_raw_frame(frame_type),
                    |AMQPRawFrame {
                         channel_id,
                         frame_type,
                         payload,
                     }: AMQPRawFrame<I>| match frame_type {
                        // This should be unreachable be better have a sensitive value anyways
                        AMQPFrameType::ProtocolHeader => {
                            Ok(AMQPFrame::ProtocolHeader(ProtocolVersion::amqp_0_9_1()))
                        }
                        AMQPFrameType::Method => all_consuming(parse_class)
                            .parse(payload)
                            .map(|(_, m)| AMQPFrame::Method(channel_id, m)),
                        AMQPFrameType::Header => all_consuming(parse_content_header)
                            .parse(payload)
                            .map(|(_, h)| AMQPFrame::Header(channel_id, h)),
                        AMQPFrameType::Body => Ok(AMQPFrame::Body(
                            channel_id,
                            payload.iter_elements().collect(),
                        )),
                        AMQPFrameType::Heartbeat => Ok(if channel_id == 0 {
                            AMQPFrame::Heartbeat
                        } else {
                            AMQPFrame::InvalidHeartbeat(channel_id)
                        }),
                    },
                )
                .parse(i),
            }
        }),
    )
    .parse(i)
}

/// Parse a raw AMQP frame
pub fn parse_raw_frame<I: ParsableInput>(
    frame_type: AMQPFrameType,
) -> impl FnMut(I) -> ParserResult<I, AMQPRawFrame<I>> {
    move |i: I| {
        context(
            "parse_raw_frame",
            flat_map((parse_id, parse_long_uint), move |(channel_id, size)| {
                map(
                    (take(size), tag(&[constants::FRAME_END][..])),
                    move |(payload, _)| AMQPRawFrame {
                        frame_type,
                        channel_id,
                        payload,
                    },
                )
            }),
        )
        .parse(i)
    }
}

/// Parse a content header frame
pub fn parse_content_header<I: ParsableInput>(i: I) -> ParserResult<I, AMQPContentHeader> {
    context(
        "parse_content_header",
        map(
            (
                parse_id,
                parse_short_uint,
                parse_long_long_uint,
                context("parse_properties", parse_properties),
            ),
            // weight is always 0 per the spec and unused; accept any value for compatibility
            |(class_id, _weight, body_size, properties)| AMQPContentHeader {
                class_id,
                body_size,
                properties,
            },
        ),
    )
    .parse(i)
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::types::{
        AMQPValue, FieldTable, LongUInt, SkipReason, SkippedFieldTable, parsing::MAX_NESTING_DEPTH,
    };

    #[test]
    fn test_protocol_header() {
        assert_eq!(
            parse_frame(&[b'A', b'M', b'Q', b'P', 0, 0, 9, 1][..]),
            Ok((
                &[][..],
                AMQPFrame::ProtocolHeader(ProtocolVersion::amqp_0_9_1())
            ))
        );
    }

    #[test]
    fn test_heartbeat() {
        assert_eq!(
            parse_frame(&[8, 0, 0, 0, 0, 0, 0, 206][..]),
            Ok((&[][..], AMQPFrame::Heartbeat))
        );
        assert_eq!(
            parse_frame(&[8, 0, 1, 0, 0, 0, 0, 206][..]),
            Ok((&[][..], AMQPFrame::InvalidHeartbeat(1)))
        );
    }

    #[test]
    fn test_parse_declare_queue_frame() {
        let frame = AMQPFrame::Method(
            1,
            AMQPClass::Queue(queue::AMQPMethod::Declare(queue::Declare {
                queue: "some_queue".into(),
                passive: true,
                durable: true,
                exclusive: true,
                auto_delete: true,
                nowait: true,
                arguments: Default::default(),
            })),
        );

        let mut buffer = vec![0u8; 30];

        assert!(gen_frame(&frame)(buffer.as_mut_slice().into()).is_ok());
        assert_eq!(parse_frame(buffer.as_slice()), Ok((&[][..], frame)));
    }

    /// A field table nested `depth` levels deep (itself included): each level
    /// holds the next under the name "a", the innermost is empty.
    fn nested_tables(depth: usize) -> Vec<u8> {
        let contents = |level: usize| ((depth - 1 - level) * 7) as u32;
        let mut out = Vec::with_capacity(depth * 7);
        for level in 0..depth {
            out.extend_from_slice(&contents(level).to_be_bytes());
            if level + 1 < depth {
                out.extend_from_slice(&[1, b'a', b'F']);
            }
        }
        out
    }

    fn depth_of(table: &FieldTable) -> usize {
        let inner = table.inner().values().map(|value| match value {
            AMQPValue::FieldTable(table) => depth_of(table),
            _ => 0,
        });
        1 + inner.max().unwrap_or(0)
    }

    fn raw_frame(frame_type: u8, channel_id: u16, payload: &[u8]) -> Vec<u8> {
        let mut frame = vec![frame_type];
        frame.extend_from_slice(&channel_id.to_be_bytes());
        frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        frame.extend_from_slice(payload);
        frame.push(constants::FRAME_END);
        frame
    }

    fn short_string(out: &mut Vec<u8>, s: &str) {
        out.push(s.len() as u8);
        out.extend_from_slice(s.as_bytes());
    }

    /// A basic content header frame on channel 1 for a body of 2 bytes, whose
    /// properties are a content type, `headers` (a field table's bytes), a
    /// delivery mode, a correlation id, a message id and a timestamp, then a
    /// body frame.
    fn content_frames(headers: &[u8]) -> Vec<u8> {
        let mut payload = Vec::new();
        payload.extend_from_slice(&60u16.to_be_bytes()); // class
        payload.extend_from_slice(&0u16.to_be_bytes()); // weight
        payload.extend_from_slice(&2u64.to_be_bytes()); // body size
        let flags: u16 = 1 << 15 | 1 << 13 | 1 << 12 | 1 << 10 | 1 << 7 | 1 << 6;
        payload.extend_from_slice(&flags.to_be_bytes());
        short_string(&mut payload, "text/plain");
        payload.extend_from_slice(headers);
        payload.push(2);
        short_string(&mut payload, "corr-1");
        short_string(&mut payload, "msg-1");
        payload.extend_from_slice(&1_700_000_000u64.to_be_bytes());
        let mut frames = raw_frame(constants::FRAME_HEADER, 1, &payload);
        frames.extend(raw_frame(constants::FRAME_BODY, 1, b"hi"));
        frames
    }

    fn expected_properties() -> basic::AMQPProperties {
        basic::AMQPProperties::default()
            .with_content_type("text/plain".into())
            .with_delivery_mode(2)
            .with_correlation_id("corr-1".into())
            .with_message_id("msg-1".into())
            .with_timestamp(1_700_000_000)
    }

    /// Parses a content header frame and the body frame after it.
    fn parse_content(frames: &[u8]) -> AMQPContentHeader {
        let (rest, header) = parse_frame(frames).expect("the header frame parses");
        assert_eq!(
            parse_frame(rest),
            Ok((&[][..], AMQPFrame::Body(1, b"hi".to_vec())))
        );
        match header {
            AMQPFrame::Header(1, header) => header,
            other => panic!("expected a content header frame, got {other:?}"),
        }
    }

    /// Runs `f` on a thread with a 1 MiB stack: half a default thread's.
    fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::Builder::new()
            .stack_size(1 << 20)
            .spawn(f)
            .unwrap()
            .join()
            .unwrap()
    }

    #[test]
    fn test_content_header_with_headers_at_the_nesting_limit() {
        let frames = content_frames(&nested_tables(MAX_NESTING_DEPTH));
        let header = parse_content(&frames);
        assert_eq!((header.class_id, header.body_size), (60, 2));
        let headers = header.properties.headers().clone().expect("headers");
        assert_eq!(depth_of(&headers), MAX_NESTING_DEPTH);
        assert_eq!(header.properties.headers_skipped(), &None);
        assert_eq!(
            header.properties,
            expected_properties().with_headers(headers)
        );
    }

    #[test]
    fn test_content_header_with_headers_over_the_nesting_limit_is_parsed_without_them() {
        for depth in [MAX_NESTING_DEPTH + 1, 1_000, 100_000] {
            let headers = nested_tables(depth);
            let size = headers.len() as LongUInt - 4;
            let frames = content_frames(&headers);
            let header = on_small_stack(move || parse_content(&frames));
            assert_eq!((header.class_id, header.body_size), (60, 2));
            assert_eq!(header.properties.headers(), &None);
            let skipped = SkippedFieldTable::new(size, SkipReason::NestingTooDeep);
            assert_eq!(header.properties.headers_skipped(), &Some(skipped));
            assert_eq!(
                header.properties,
                expected_properties().with_headers_skipped(skipped),
                "depth {depth}"
            );
        }
    }

    #[test]
    fn test_content_header_with_malformed_headers_is_parsed_without_them() {
        // A header name that is not UTF-8.
        let frames = content_frames(&[0, 0, 0, 4, 2, 0xff, 0xfe, b'V']);
        let header = parse_content(&frames);
        assert_eq!(
            header.properties,
            expected_properties()
                .with_headers_skipped(SkippedFieldTable::new(4, SkipReason::Malformed))
        );
    }

    #[test]
    fn test_content_header_with_headers_cut_short_is_an_error() {
        // Headers announcing more bytes than the frame holds.
        let frames = content_frames(&[0, 0, 1, 0, 1, b'a', b'V']);
        assert!(parse_frame(&frames[..]).is_err());
    }

    #[test]
    fn test_method_frame_with_arguments_over_the_nesting_limit_is_an_error() {
        // Method arguments are not skipped: the frame cannot be understood
        // without them. It fails without descending past the limit.
        let mut args = vec![0, 0]; // ticket
        short_string(&mut args, "some_queue");
        args.push(0); // passive, durable, exclusive, auto_delete, nowait
        args.extend(nested_tables(100_000));
        let mut payload = 50u16.to_be_bytes().to_vec(); // queue
        payload.extend_from_slice(&10u16.to_be_bytes()); // declare
        payload.extend(args);
        let frame = raw_frame(constants::FRAME_METHOD, 1, &payload);
        let failed =
            on_small_stack(move || matches!(parse_frame(&frame[..]), Err(nom::Err::Error(_))));
        assert!(failed);
    }

    #[test]
    fn test_skipped_headers_are_not_serialised() {
        let skipped = SkippedFieldTable::new(7_000, SkipReason::NestingTooDeep);
        let properties = expected_properties().with_headers_skipped(skipped);
        let frame = AMQPFrame::Header(
            1,
            AMQPContentHeader {
                class_id: 60,
                body_size: 2,
                properties,
            },
        );
        let mut buffer = vec![0u8; 128];
        let written = gen_frame(&frame)(buffer.as_mut_slice().into())
            .unwrap()
            .position as usize;
        let (rest, parsed) = parse_frame(&buffer[..written]).unwrap();
        assert!(rest.is_empty());
        let AMQPFrame::Header(_, header) = parsed else {
            panic!("expected a content header frame, got {parsed:?}")
        };
        assert_eq!(header.properties, expected_properties());
    }
}
