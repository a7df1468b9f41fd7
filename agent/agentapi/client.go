package agentapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"tern/instance/apiv1"
	"tern/instance/client"
)

// Client talks to one agent.
type Client struct {
	base string
	http *http.Client
}

// NewClient returns a client for the agent at base (http://host:port or
// host:port). httpClient nil means http.DefaultClient.
func NewClient(base string, httpClient *http.Client) *Client {
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	if httpClient == nil {
		httpClient = http.DefaultClient
	}
	return &Client{base: strings.TrimRight(base, "/"), http: httpClient}
}

// do sends body (if not nil) and decodes a 2xx answer into out (if not
// nil); other answers are *client.APIError.
func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encoding %s %s: %w", method, path, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return fmt.Errorf("building request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, c.base+path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("reading %s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		e := &client.APIError{Status: resp.StatusCode}
		if json.Unmarshal(b, &e.Body) != nil || e.Body.ErrorCode == "" {
			e.Body = apiv1.Error{ErrorCode: fmt.Sprintf("http_%d", resp.StatusCode), Message: strings.TrimSpace(string(b))}
		}
		return e
	}
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("decoding %s %s: %w", method, path, err)
		}
	}
	return nil
}

// Version is the agent's (and its vmms') version.
func (c *Client) Version(ctx context.Context) (apiv1.Version, error) {
	var v apiv1.Version
	return v, c.do(ctx, http.MethodGet, "/v1/version", nil, &v)
}

// Inventory is the host's capacity, allocations and processes.
func (c *Client) Inventory(ctx context.Context) (Inventory, error) {
	var v Inventory
	return v, c.do(ctx, http.MethodGet, "/v1/inventory", nil, &v)
}

// InventoryAfter waits (a bounded long-poll) for an inventory newer than
// generation gen and returns it; after the bound, the current one.
func (c *Client) InventoryAfter(ctx context.Context, gen InventoryGen) (Inventory, error) {
	var v Inventory
	return v, c.do(ctx, http.MethodGet, fmt.Sprintf("/v1/inventory?after_gen=%d", gen), nil, &v)
}

// EnsureVMM starts vmm id (once) and ensures its spec.
func (c *Client) EnsureVMM(ctx context.Context, id string, req EnsureVMM) (VMMStatus, error) {
	var v VMMStatus
	return v, c.do(ctx, http.MethodPut, "/v1/vmms/"+url.PathEscape(id), req, &v)
}

// VMM returns vmm id's status (a *client.APIError with CodeNoSuchVMM
// once it is gone).
func (c *Client) VMM(ctx context.Context, id string) (VMMStatus, error) {
	var v VMMStatus
	return v, c.do(ctx, http.MethodGet, "/v1/vmms/"+url.PathEscape(id), nil, &v)
}

// VMMVersion is vmm id's own GET /v1/version.
func (c *Client) VMMVersion(ctx context.Context, id string) (apiv1.Version, error) {
	var v apiv1.Version
	return v, c.do(ctx, http.MethodGet, "/v1/vmms/"+url.PathEscape(id)+"/version", nil, &v)
}

// DeleteVMM stops vmm id's process; a vmm that is not there is no error.
func (c *Client) DeleteVMM(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/vmms/"+url.PathEscape(id), nil, nil)
}

// RequestState asks vmm id for run, stop or reboot.
func (c *Client) RequestState(ctx context.Context, id string, r apiv1.Request) error {
	return c.do(ctx, http.MethodPut, "/v1/vmms/"+url.PathEscape(id)+"/state", apiv1.StateRequest{Requested: r}, nil)
}

// EnsureRegion creates region id (once) and runs its downstairs.
func (c *Client) EnsureRegion(ctx context.Context, id string, spec RegionSpec) (Region, error) {
	var r Region
	return r, c.do(ctx, http.MethodPut, "/v1/regions/"+url.PathEscape(id), spec, &r)
}

// DeleteRegion stops region id's downstairs and removes it.
func (c *Client) DeleteRegion(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/regions/"+url.PathEscape(id), nil, nil)
}

// PutV2P replaces the host's network mappings.
func (c *Client) PutV2P(ctx context.Context, m []Mapping) error {
	return c.do(ctx, http.MethodPut, "/v1/v2p", m, nil)
}

// V2P returns the host's network mappings.
func (c *Client) V2P(ctx context.Context) ([]Mapping, error) {
	var m []Mapping
	return m, c.do(ctx, http.MethodGet, "/v1/v2p", nil, &m)
}
