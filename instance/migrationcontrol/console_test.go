package migrationcontrol

import (
	"bufio"
	"context"
	"errors"
	"io"
	"strings"
)

// readerLines is a linuxtest.LineSource over a stream (QEMU's stdout,
// where its serial console goes): a goroutine reads it line by line
// until it ends.
type readerLines struct {
	lines chan string
	// done is closed when the stream ended; err is then why.
	done chan struct{}
	err  error
}

func newReaderLines(r io.Reader) *readerLines {
	l := &readerLines{lines: make(chan string, 4096), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			l.lines <- strings.TrimRight(sc.Text(), "\r")
		}
		l.err = sc.Err()
		if l.err == nil {
			l.err = io.EOF
		}
	}()
	return l
}

func (l *readerLines) NextLine(ctx context.Context) (string, error) {
	select {
	case s := <-l.lines:
		return s, nil
	default:
	}
	select {
	case s := <-l.lines:
		return s, nil
	case <-l.done:
		select {
		case s := <-l.lines:
			return s, nil
		default:
		}
		return "", errors.New("the console ended: " + l.err.Error())
	case <-ctx.Done():
		return "", ctx.Err()
	}
}
