// Package dsclient is the client end of one downstairs session: what the
// replicated upstairs, the erasure-coded volume and the read-only probe
// (volume/inspect) all do the same way with a downstairs.
//
// It owns:
//
//   - Dial: the QUIC connection with mutual TLS (volume/transport) and the
//     one session stream on it (Conn). The stream's deadline is the dial
//     context's, if it has one, until the caller lifts it.
//   - The setup, in the protocol's order: Hello (the client's versions and
//     identity, answered by the region the downstairs serves), Activate
//     with a generation (answered by ActivateAck, or by Fenced or a
//     refusal), and ExtentVersions (every extent's version, a frame at a
//     time). Each step reads its reply in order, bounded by
//     Options.ReplyTimeout when it is set.
//   - Calls by job id: Send and Receive move one message each way, and
//     Call sends a request stamped with a job id and reads the reply
//     answering it (a synchronous session's request and reply).
//   - Error, the typed failure of a step: which step, how it failed and
//     what the downstairs answered (its error code, the generation that
//     fenced it). errors.Is matches volume.ErrRegionMismatch,
//     volume.ErrFenced and volume.ErrGenTooLow on the refusals that mean
//     them.
//
// It leaves to its users what differs between them: whether and when to
// activate (the layouts wait for their activation to let a downstairs
// in; a probe never activates), what a region served must match, the
// session's structure once set up (the upstairs' owner goroutine with
// its call queue and reply checks, the EC session's reply reader
// matching pending requests, the probe's request-then-reply), and how a
// failure is worded for their users: Error's own text is one wording,
// and a user that names the downstairs inside its sentences words the
// steps itself from Error's fields.
//
// A Conn is not safe for concurrent use, except that one goroutine may
// send while another receives (the stream's two directions are
// independent).
package dsclient
