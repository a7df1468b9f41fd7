package main

import (
	"context"
	"log/slog"
	"sync"
)

// replicaLogFilter keeps a client command's stderr readable while the
// upstairs retries a replica it cannot reach: the upstairs logs a warning
// on every failed attempt (every 2 s at most once backed off), which is
// right for a long-running server and noise for a command whose result is
// one line. Of the warnings that name a replica (the "replica" attribute)
// it passes each message once per replica, and none at all for a replica
// the command has already named to the user (quiet). Every other record
// passes: errors, and the info and debug lines (state changes) asked for
// with --log-level.
type replicaLogFilter struct {
	next  slog.Handler
	state *replicaLogState // shared by the handlers WithAttrs and WithGroup derive
}

type replicaLogState struct {
	mu sync.Mutex
	// seen holds the (message, replica) pairs already passed.
	seen map[replicaLogKey]bool
	// quiet holds the replicas whose warnings are all dropped.
	quiet map[int64]bool
}

type replicaLogKey struct {
	msg     string
	replica int64
}

func newReplicaLogFilter(next slog.Handler) *replicaLogFilter {
	return &replicaLogFilter{next: next, state: &replicaLogState{
		seen:  map[replicaLogKey]bool{},
		quiet: map[int64]bool{},
	}}
}

// quiet drops every further warning about replica r: the command has told
// the user about it in its own words.
func (h *replicaLogFilter) quiet(r int) {
	h.state.mu.Lock()
	defer h.state.mu.Unlock()
	h.state.quiet[int64(r)] = true
}

// Enabled reports whether the next handler takes records at level.
func (h *replicaLogFilter) Enabled(ctx context.Context, level slog.Level) bool {
	return h.next.Enabled(ctx, level)
}

// Handle passes rec on unless it is a warning that repeats a replica's
// message or concerns a quiet replica (see replicaLogFilter).
func (h *replicaLogFilter) Handle(ctx context.Context, rec slog.Record) error {
	if rec.Level != slog.LevelWarn {
		return h.next.Handle(ctx, rec)
	}
	replica, ok := int64(0), false
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == "replica" && a.Value.Kind() == slog.KindInt64 {
			replica, ok = a.Value.Int64(), true
			return false
		}
		return true
	})
	if !ok {
		return h.next.Handle(ctx, rec)
	}
	s := h.state
	s.mu.Lock()
	key := replicaLogKey{rec.Message, replica}
	drop := s.quiet[replica] || s.seen[key]
	s.seen[key] = true
	s.mu.Unlock()
	if drop {
		return nil
	}
	return h.next.Handle(ctx, rec)
}

// WithAttrs returns a filter over the next handler with attrs, sharing
// this filter's memory.
func (h *replicaLogFilter) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &replicaLogFilter{next: h.next.WithAttrs(attrs), state: h.state}
}

// WithGroup returns a filter over the next handler in group name, sharing
// this filter's memory.
func (h *replicaLogFilter) WithGroup(name string) slog.Handler {
	return &replicaLogFilter{next: h.next.WithGroup(name), state: h.state}
}
