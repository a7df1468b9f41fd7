package migrationcontrol

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sync"
)

// qmp is a QEMU Machine Protocol connection: one command at a time, and
// every event kept, in order, for waitEvent.
type qmp struct {
	conn    net.Conn
	replies chan qmpMessage
	// events is signalled when an event was appended to log.
	events chan struct{}
	// done is closed when the connection ended.
	done chan struct{}

	mu  sync.Mutex
	log []qmpMessage // every event received, guarded by mu
}

type qmpMessage struct {
	Event  string          `json:"event"`
	Data   json.RawMessage `json:"data"`
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
	Greeting json.RawMessage `json:"QMP"`
}

// newQMP reads the greeting on conn and leaves negotiation mode.
func newQMP(ctx context.Context, conn net.Conn) (*qmp, error) {
	q := &qmp{conn: conn, replies: make(chan qmpMessage, 1), events: make(chan struct{}, 1), done: make(chan struct{})}
	greeted := make(chan struct{})
	go func() {
		defer close(q.done)
		sc := bufio.NewScanner(conn)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		first := true
		for sc.Scan() {
			var m qmpMessage
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				continue
			}
			switch {
			case first && m.Greeting != nil:
				first = false
				close(greeted)
			case m.Event != "":
				q.mu.Lock()
				q.log = append(q.log, m)
				q.mu.Unlock()
				select {
				case q.events <- struct{}{}:
				default:
				}
			default:
				q.replies <- m
			}
		}
	}()
	select {
	case <-greeted:
	case <-q.done:
		return nil, fmt.Errorf("QMP: no greeting")
	case <-ctx.Done():
		return nil, fmt.Errorf("QMP: waiting for the greeting: %w", ctx.Err())
	}
	if _, err := q.exec(ctx, "qmp_capabilities", nil); err != nil {
		return nil, err
	}
	return q, nil
}

// exec runs command with args (nil: none) and returns its "return".
func (q *qmp) exec(ctx context.Context, command string, args any) (json.RawMessage, error) {
	req := map[string]any{"execute": command}
	if args != nil {
		req["arguments"] = args
	}
	b, _ := json.Marshal(req)
	if _, err := q.conn.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("QMP %s: %w", command, err)
	}
	select {
	case m := <-q.replies:
		if m.Error != nil {
			return nil, fmt.Errorf("QMP %s: %s: %s", command, m.Error.Class, m.Error.Desc)
		}
		return m.Return, nil
	case <-q.done:
		return nil, fmt.Errorf("QMP %s: the connection ended", command)
	case <-ctx.Done():
		return nil, fmt.Errorf("QMP %s: %w", command, ctx.Err())
	}
}

// waitEvent returns the first event from index from on that match
// accepts, and the index after it.
func (q *qmp) waitEvent(ctx context.Context, from int, match func(qmpMessage) bool) (qmpMessage, int, error) {
	for {
		q.mu.Lock()
		log := q.log
		q.mu.Unlock()
		for ; from < len(log); from++ {
			if match(log[from]) {
				return log[from], from + 1, nil
			}
		}
		select {
		case <-q.events:
		case <-q.done:
			return qmpMessage{}, from, fmt.Errorf("QMP: the connection ended")
		case <-ctx.Done():
			return qmpMessage{}, from, ctx.Err()
		}
	}
}

// eventLog returns every event so far, one a line.
func (q *qmp) eventLog() string {
	q.mu.Lock()
	defer q.mu.Unlock()
	var s string
	for _, m := range q.log {
		s += fmt.Sprintf("%s %s\n", m.Event, m.Data)
	}
	return s
}

// count returns how many events came so far.
func (q *qmp) count() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.log)
}

// find returns the first event named name, if one came.
func (q *qmp) find(name string) (qmpMessage, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, m := range q.log {
		if m.Event == name {
			return m, true
		}
	}
	return qmpMessage{}, false
}
