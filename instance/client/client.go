package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/coder/websocket"

	"tern/instance/apiv1"
)

// APIError is a non-2xx answer.
type APIError struct {
	Status int
	// Body is the server's error body.
	Body apiv1.Error
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%d %s: %s", e.Status, e.Body.ErrorCode, e.Body.Message)
}

// IsCode reports whether err is an *APIError with the given error_code.
func IsCode(err error, code string) bool {
	var e *APIError
	return errors.As(err, &e) && e.Body.ErrorCode == code
}

// Client talks to one vmm server.
type Client struct {
	base string
	http *http.Client
}

// New returns a client for server, "http://host:port", "https://…" or
// "host:port" (http). httpClient nil means http.DefaultClient.
func New(server string, httpClient *http.Client) (*Client, error) {
	if !strings.Contains(server, "://") {
		server = "http://" + server
	}
	u, err := url.Parse(server)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("parsing server address %q: want http://host:port or host:port", server)
	}
	if httpClient == nil {
		httpClient = http.DefaultClient
	}
	return &Client{base: strings.TrimRight(u.String(), "/"), http: httpClient}, nil
}

// At returns a client for another server that shares c's HTTP client (and
// so its TLS configuration): a migration's target, or the server a serial
// console moved to.
func (c *Client) At(server string) (*Client, error) { return New(server, c.http) }

// Base returns the server's base URL.
func (c *Client) Base() string { return c.base }

// do sends a request with an optional JSON body and decodes a 2xx JSON
// answer into out (if not nil).
func (c *Client) do(ctx context.Context, method, path string, body []byte, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return 0, fmt.Errorf("building request: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, fmt.Errorf("reading %s %s answer: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		e := &APIError{Status: resp.StatusCode}
		if json.Unmarshal(b, &e.Body) != nil || e.Body.ErrorCode == "" {
			e.Body = apiv1.Error{ErrorCode: fmt.Sprintf("http_%d", resp.StatusCode), Message: strings.TrimSpace(string(b))}
		}
		return resp.StatusCode, e
	}
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.StatusCode, fmt.Errorf("decoding %s %s answer: %w", method, path, err)
		}
	}
	return resp.StatusCode, nil
}

// EnsureRaw sends body as the spec, unchanged (for specs read from a file
// and for tests of bad input).
func (c *Client) EnsureRaw(ctx context.Context, body []byte) (apiv1.Instance, error) {
	var v apiv1.Instance
	_, err := c.do(ctx, http.MethodPut, "/v1/instance", body, &v)
	return v, err
}

// Ensure creates the instance from spec.
func (c *Client) Ensure(ctx context.Context, spec apiv1.Spec) (apiv1.Instance, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return apiv1.Instance{}, fmt.Errorf("encoding spec: %w", err)
	}
	return c.EnsureRaw(ctx, b)
}

// Get returns the instance.
func (c *Client) Get(ctx context.Context) (apiv1.Instance, error) {
	var v apiv1.Instance
	_, err := c.do(ctx, http.MethodGet, "/v1/instance", nil, &v)
	return v, err
}

// Version returns the VMM's build and migration versions.
func (c *Client) Version(ctx context.Context) (apiv1.Version, error) {
	var v apiv1.Version
	_, err := c.do(ctx, http.MethodGet, "/v1/version", nil, &v)
	return v, err
}

// RequestState asks for run, stop or reboot.
func (c *Client) RequestState(ctx context.Context, r apiv1.Request) error {
	b, err := json.Marshal(apiv1.StateRequest{Requested: r})
	if err != nil {
		return fmt.Errorf("encoding state request: %w", err)
	}
	_, err = c.do(ctx, http.MethodPut, "/v1/instance/state", b, nil)
	return err
}

// Monitor long-polls for the first snapshot with gen > afterGen; after
// the server's 30 s it returns the current one (whose gen may not be
// newer: ask again).
func (c *Client) Monitor(ctx context.Context, afterGen apiv1.ViewGen) (apiv1.View, error) {
	var s apiv1.View
	_, err := c.do(ctx, http.MethodGet, fmt.Sprintf("/v1/instance/state?after_gen=%d", afterGen), nil, &s)
	return s, err
}

// WaitFor follows the monitor from afterGen until done accepts a
// snapshot, and returns it. It ends with the monitor's error (410 once
// the instance is gone) or ctx's.
func (c *Client) WaitFor(ctx context.Context, afterGen apiv1.ViewGen, done func(apiv1.View) bool) (apiv1.View, error) {
	for {
		s, err := c.Monitor(ctx, afterGen)
		if err != nil {
			return s, err
		}
		if done(s) {
			return s, nil
		}
		afterGen = max(afterGen, s.Gen)
	}
}

// Disk returns one disk with its replicas.
func (c *Client) Disk(ctx context.Context, name string) (apiv1.DiskStatus, error) {
	var d apiv1.DiskStatus
	_, err := c.do(ctx, http.MethodGet, "/v1/instance/disks/"+url.PathEscape(name), nil, &d)
	return d, err
}

// SerialHistory reads the console from fromOffset, at most maxBytes (0:
// the server's default).
func (c *Client) SerialHistory(ctx context.Context, fromOffset uint64, maxBytes int) (apiv1.SerialHistory, error) {
	q := fmt.Sprintf("?from_offset=%d", fromOffset)
	if maxBytes > 0 {
		q += fmt.Sprintf("&max_bytes=%d", maxBytes)
	}
	var h apiv1.SerialHistory
	_, err := c.do(ctx, http.MethodGet, "/v1/instance/serial/history"+q, nil, &h)
	return h, err
}

// Serial opens the console websocket from fromOffset: read it for output,
// write to it to type into the guest. The caller closes it.
func (c *Client) Serial(ctx context.Context, fromOffset uint64) (*websocket.Conn, error) {
	u := strings.Replace(c.base, "http", "ws", 1) + fmt.Sprintf("/v1/instance/serial?from_offset=%d", fromOffset)
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: c.http})
	if err != nil {
		if resp != nil {
			return nil, fmt.Errorf("opening serial console: %d: %w", resp.StatusCode, err)
		}
		return nil, fmt.Errorf("opening serial console: %w", err)
	}
	conn.SetReadLimit(1 << 20)
	return conn, nil
}
