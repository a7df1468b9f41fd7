package bench

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"
)

// qmpClient speaks QEMU's machine protocol (QMP) on one connection:
// newline-separated JSON, a greeting, then one answer per command with
// asynchronous events interleaved (skipped here).
type qmpClient struct {
	conn net.Conn
	r    *bufio.Reader
	// wait bounds each command's answer.
	wait time.Duration
}

// qmpMaxLine bounds one QMP message.
const qmpMaxLine = 1 << 20

// qmpMessage is any message QEMU sends: a greeting, an answer (return or
// error) or an event.
type qmpMessage struct {
	QMP    json.RawMessage `json:"QMP"`
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
	Event string `json:"event"`
}

// parseQMPMessage decodes one line from QEMU; it must be exactly one of
// greeting, answer or event.
func parseQMPMessage(line []byte) (qmpMessage, error) {
	var m qmpMessage
	if err := json.Unmarshal(line, &m); err != nil {
		return qmpMessage{}, fmt.Errorf("decoding QMP message: %w", err)
	}
	kinds := 0
	for _, present := range []bool{m.QMP != nil, m.Return != nil, m.Error != nil, m.Event != ""} {
		if present {
			kinds++
		}
	}
	if kinds != 1 {
		return qmpMessage{}, fmt.Errorf("decoding QMP message: want one of QMP, return, error or event: %.200q", line)
	}
	return m, nil
}

// newQMPClient reads the greeting on conn and enters command mode.
func newQMPClient(conn net.Conn, wait time.Duration) (*qmpClient, error) {
	q := &qmpClient{conn: conn, r: bufio.NewReaderSize(conn, 64<<10), wait: wait}
	m, err := q.read()
	if err != nil {
		return nil, fmt.Errorf("reading the QMP greeting: %w", err)
	}
	if m.QMP == nil {
		return nil, errors.New("reading the QMP greeting: QEMU sent something else first")
	}
	if err := q.execute("qmp_capabilities", nil, nil); err != nil {
		return nil, err
	}
	return q, nil
}

func (q *qmpClient) read() (qmpMessage, error) {
	if err := q.conn.SetReadDeadline(time.Now().Add(q.wait)); err != nil {
		return qmpMessage{}, err
	}
	var line []byte
	for {
		chunk, isPrefix, err := q.r.ReadLine()
		if err != nil {
			return qmpMessage{}, err
		}
		line = append(line, chunk...)
		if len(line) > qmpMaxLine {
			return qmpMessage{}, fmt.Errorf("QMP message over %d bytes", qmpMaxLine)
		}
		if !isPrefix {
			return parseQMPMessage(line)
		}
	}
}

// execute runs command with args (nil: none) and decodes its return into
// out (nil: ignored).
func (q *qmpClient) execute(command string, args, out any) error {
	req := map[string]any{"execute": command}
	if args != nil {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	if err := q.conn.SetWriteDeadline(time.Now().Add(q.wait)); err != nil {
		return err
	}
	if _, err := q.conn.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("sending QMP %s: %w", command, err)
	}
	for {
		m, err := q.read()
		if err != nil {
			return fmt.Errorf("waiting for QMP %s's answer: %w", command, err)
		}
		switch {
		case m.Event != "":
			continue
		case m.Error != nil:
			return fmt.Errorf("QMP %s: %s: %s", command, m.Error.Class, m.Error.Desc)
		case out != nil:
			if err := json.Unmarshal(m.Return, out); err != nil {
				return fmt.Errorf("decoding QMP %s's answer: %w", command, err)
			}
		}
		return nil
	}
}

func (q *qmpClient) close() error { return q.conn.Close() }

// qemuMigrationStatus is the part of query-migrate the benchmark reads:
// times in milliseconds, once completed.
type qemuMigrationStatus struct {
	Status    string `json:"status"`
	TotalTime *int64 `json:"total-time"`
	Downtime  *int64 `json:"downtime"`
	ErrorDesc string `json:"error-desc"`
	RAM       *struct {
		Transferred uint64 `json:"transferred"`
		DirtySyncs  uint64 `json:"dirty-sync-count"`
	} `json:"ram"`
}
