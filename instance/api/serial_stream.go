package api

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/coder/websocket"

	"tern/instance"
	"tern/instance/apiv1"
)

// serialChunk bounds one websocket message of console output.
const serialChunk = 32 << 10

// serialStream is GET /v1/instance/serial: a websocket that replays the
// console from from_offset (default 0: all that is kept) and then follows
// it live as binary messages, while every message the client sends is
// typed into the guest's UART. It closes normally once the instance is
// gone and its console drained, or when the server closes.
func (s *Server) serialStream(w http.ResponseWriter, r *http.Request) {
	from, err := uintParam(r.URL.Query().Get("from_offset"), 0)
	if err != nil {
		writeError(w, http.StatusBadRequest, apiv1.Error{ErrorCode: apiv1.CodeMalformed, Message: "from_offset: " + err.Error()})
		return
	}
	c := s.instanceOr404(w)
	if c == nil {
		return
	}
	s.streams.Add(1)
	defer s.streams.Done()
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		return // Accept answered the client
	}
	defer conn.CloseNow()
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	stop := context.AfterFunc(r.Context(), cancel)
	defer stop()

	// The reader is this handler's: it ends when the connection does,
	// which the deferred CloseNow guarantees, and is waited for below.
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		defer cancel()
		for {
			_, msg, err := conn.Read(ctx)
			if err != nil {
				return
			}
			c.SerialInput(msg)
		}
	}()
	defer func() { conn.CloseNow(); <-readerDone }()

	if err := streamConsole(ctx, conn, c, from); err != nil {
		return
	}
	if to := c.MigratedTo(); to != "" {
		// The instance runs on elsewhere: one text message names where,
		// and the socket closes normally.
		msg, _ := json.Marshal(apiv1.MigratedTo{URL: to})
		if err := conn.Write(ctx, websocket.MessageText, msg); err != nil {
			return
		}
		conn.Close(websocket.StatusNormalClosure, "instance migrated")
		return
	}
	conn.Close(websocket.StatusNormalClosure, "instance gone")
}

// streamConsole sends the console from offset until the instance is gone
// and everything was sent (nil), or ctx ends or a write fails (error).
func streamConsole(ctx context.Context, conn *websocket.Conn, c *instance.Controller, offset uint64) error {
	h := c.Console()
	sub := h.Subscribe()
	defer sub.Close()
	for {
		data, _, next, err := h.ReadFrom(offset, serialChunk)
		if err != nil {
			return err
		}
		if len(data) > 0 {
			if err := conn.Write(ctx, websocket.MessageBinary, data); err != nil {
				return err
			}
			offset = next
			continue
		}
		select {
		case <-sub.C():
		case <-c.Done():
			if _, end := h.Bounds(); end == offset {
				return nil
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
