package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"tern/instance/apiv1"
	"tern/instance/client"
	"tern/internal/tlsconf"
)

func init() { rootCmd.AddCommand(newInstanceCmd()) }

// instanceFlags are the flags every `tern instance` command shares.
type instanceFlags struct {
	server string
	certs  string
}

func (f *instanceFlags) client() (*client.Client, error) {
	var hc *http.Client
	if f.certs != "" {
		b, err := tlsconf.Load(f.certs)
		if err != nil {
			return nil, fmt.Errorf("loading certificates: %w", err)
		}
		hc = &http.Client{Transport: &http.Transport{TLSClientConfig: b.ClientConfig("")}}
	}
	return client.New(f.server, hc)
}

func newInstanceCmd() *cobra.Command {
	f := &instanceFlags{}
	cmd := &cobra.Command{
		Use:   "instance",
		Short: "Drive the instance of a tern vmm serve process over its control API",
	}
	cmd.PersistentFlags().StringVar(&f.server, "server", "127.0.0.1:12400", "the vmm's API: http://host:port, https://host:port or host:port")
	cmd.PersistentFlags().StringVar(&f.certs, "certs", "", "certificate directory for a vmm serving --api-tls")
	var specFile string
	ensure := &cobra.Command{
		Use:   "ensure --spec FILE",
		Short: "Create the instance from a JSON spec; returns once the server accepted it",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if specFile == "" {
				return errors.New("--spec is required")
			}
			b, err := os.ReadFile(specFile)
			if err != nil {
				return fmt.Errorf("reading spec: %w", err)
			}
			c, err := f.client()
			if err != nil {
				return err
			}
			v, err := c.EnsureRaw(cmd.Context(), b)
			if err != nil {
				return describeAPIError(err)
			}
			return printJSON(cmd.OutOrStdout(), v)
		},
	}
	ensure.Flags().StringVar(&specFile, "spec", "", "the instance spec (JSON)")
	get := &cobra.Command{
		Use: "get", Short: "Print the instance as JSON", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			v, err := c.Get(cmd.Context())
			if err != nil {
				return describeAPIError(err)
			}
			return printJSON(cmd.OutOrStdout(), v)
		},
	}
	cmd.AddCommand(ensure, get, newInstanceWatchCmd(f), newInstanceSerialCmd(f))
	for _, r := range []struct {
		req   apiv1.Request
		short string
	}{
		{apiv1.Run, "Start the vCPUs (at once, or as soon as activation finishes)"},
		{apiv1.Stop, "Stop the instance; during creation this aborts it"},
		{apiv1.Reboot, "Reboot the running guest"},
	} {
		cmd.AddCommand(&cobra.Command{
			Use: r.req.String(), Short: r.short, Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				c, err := f.client()
				if err != nil {
					return err
				}
				return describeAPIError(c.RequestState(cmd.Context(), r.req))
			},
		})
	}
	return cmd
}

// describeAPIError keeps the server's words.
func describeAPIError(err error) error {
	var e *client.APIError
	if errors.As(err, &e) && len(e.Body.Problems) > 0 {
		return fmt.Errorf("%s (%d):\n  %s", e.Body.ErrorCode, e.Status, strings.Join(e.Body.Problems, "\n  "))
	}
	return err
}

func printJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// watchRefresh is how often watch re-reads the disks' activation progress
// while the instance is creating or starting (the monitor wakes only on
// state changes).
const watchRefresh = 500 * time.Millisecond

func newInstanceWatchCmd(f *instanceFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "watch",
		Short: "Follow the instance's state until it is gone: a progress bar on a terminal, JSON lines otherwise",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			isTTY := false
			if file, ok := out.(*os.File); ok {
				isTTY = term.IsTerminal(int(file.Fd()))
			}
			return watchInstance(cmd.Context(), c, out, isTTY)
		},
	}
}

// watchInstance prints every snapshot the monitor gives and, while the
// instance activates, its disks' progress.
func watchInstance(ctx context.Context, c *client.Client, out io.Writer, isTTY bool) error {
	var gen apiv1.ViewGen
	var bar *progressbar.ProgressBar
	enc := json.NewEncoder(out)
	for {
		mctx, cancel := context.WithTimeout(ctx, watchRefresh)
		snap, err := c.Monitor(mctx, gen)
		timedOut := mctx.Err() != nil && ctx.Err() == nil
		cancel()
		switch {
		case client.IsCode(err, "instance_gone"):
			return nil
		case timedOut:
			// No new state: refresh the activation progress below.
		case err != nil:
			return describeAPIError(err)
		case snap.Gen > gen:
			gen = snap.Gen
			if isTTY {
				fmt.Fprintf(out, "\ngen %d: %s\n", snap.Gen, snap.State)
				bar = nil
			} else if err := enc.Encode(snap); err != nil {
				return err
			}
		}
		v, err := c.Get(ctx)
		if err != nil {
			return describeAPIError(err)
		}
		if v.State != apiv1.Creating && v.State != apiv1.Starting {
			continue
		}
		for _, d := range v.Disks {
			if d.Activation == nil {
				continue
			}
			p := d.Activation
			if !isTTY {
				if err := enc.Encode(map[string]any{"disk": d.Name, "state": d.State, "activation": p}); err != nil {
					return err
				}
				continue
			}
			if bar == nil {
				bar = progressbar.NewOptions64(-1, progressbar.OptionSetWriter(out), progressbar.OptionShowBytes(true))
			}
			if p.BytesTotal > 0 {
				bar.ChangeMax64(int64(p.BytesTotal))
			}
			bar.Describe(fmt.Sprintf("%s %s extents %d/%d", d.Name, p.Phase, p.ExtentsDone, p.ExtentsTotal))
			bar.Set64(int64(p.BytesDone))
		}
	}
}

func newInstanceSerialCmd(f *instanceFlags) *cobra.Command {
	var from uint64
	cmd := &cobra.Command{
		Use:   "serial",
		Short: "Attach to the guest's console: its history, then live; Ctrl-] leaves",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			return attachSerial(cmd.Context(), c, from, os.Stdin, cmd.OutOrStdout())
		},
	}
	cmd.Flags().Uint64Var(&from, "from-offset", 0, "console offset to replay from")
	return cmd
}

// ctrlBracket is Ctrl-], which leaves the console.
const ctrlBracket = 0x1d

// attachSerial copies the console to out and in to the guest until Ctrl-],
// ctx ends, or the instance is gone. When the source of a migration says
// where the instance went ({"migrated_to": URL}), it reconnects there
// from the offset it had reached: the target's console history is the
// source's, continued.
func attachSerial(ctx context.Context, c *client.Client, from uint64, in *os.File, out io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	conn, err := c.Serial(ctx, from)
	if err != nil {
		return err
	}
	// cur is the connection input goes to; the reader below replaces it
	// when it follows a migration.
	var (
		mu  sync.Mutex
		cur = conn
	)
	defer func() { mu.Lock(); cur.CloseNow(); mu.Unlock() }()
	if term.IsTerminal(int(in.Fd())) {
		old, err := term.MakeRaw(int(in.Fd()))
		if err != nil {
			return fmt.Errorf("setting the terminal raw: %w", err)
		}
		defer term.Restore(int(in.Fd()), old)
		fmt.Fprint(out, "[attached; Ctrl-] leaves]\r\n")
	}
	write := func(data []byte) error {
		mu.Lock()
		conn := cur
		mu.Unlock()
		return conn.Write(ctx, websocket.MessageBinary, data)
	}
	// The reader of in may stay blocked in read(2) after we return; it is
	// the process's, which exits right after. Ctrl-] leaves; the end of
	// in does not (piped input still shows the guest's answers until the
	// instance is gone or SIGINT). Input typed while the console moves
	// to a migration's target may be lost.
	go func() {
		buf := make([]byte, 1024)
		for {
			n, err := in.Read(buf)
			if n > 0 {
				data := buf[:n]
				if i := strings.IndexByte(string(data), ctrlBracket); i >= 0 {
					if i > 0 {
						write(data[:i])
					}
					cancel()
					return
				}
				if write(data) != nil && ctx.Err() != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	offset := from
	var movedTo string
	for {
		typ, msg, err := conn.Read(ctx)
		if err != nil {
			if ctx.Err() != nil {
				conn.Close(websocket.StatusNormalClosure, "")
				return nil
			}
			if movedTo != "" {
				// The source closed after naming the target: follow it.
				next, err := c.At(movedTo)
				if err != nil {
					return fmt.Errorf("following the migrated console: %w", err)
				}
				nconn, err := next.Serial(ctx, offset)
				if err != nil {
					return fmt.Errorf("following the migrated console to %s: %w", movedTo, err)
				}
				mu.Lock()
				cur.CloseNow()
				cur, conn, c, movedTo = nconn, nconn, next, ""
				mu.Unlock()
				continue
			}
			if websocket.CloseStatus(err) == websocket.StatusNormalClosure {
				conn.Close(websocket.StatusNormalClosure, "")
				return nil
			}
			return fmt.Errorf("reading serial console: %w", err)
		}
		if typ == websocket.MessageText {
			if u, ok := parseSerialMigratedTo(msg); ok {
				movedTo = u
			}
			continue
		}
		offset += uint64(len(msg))
		if _, err := out.Write(msg); err != nil {
			return err
		}
	}
}

// parseSerialMigratedTo reads the text message a migration's source sends
// its console watchers before it closes: {"migrated_to": URL}, URL being
// the target's API (http://host:port). ok is false for anything else.
func parseSerialMigratedTo(msg []byte) (url string, ok bool) {
	var m struct {
		MigratedTo string `json:"migrated_to"`
	}
	if json.Unmarshal(msg, &m) != nil || m.MigratedTo == "" {
		return "", false
	}
	if _, err := client.New(m.MigratedTo, nil); err != nil {
		return "", false
	}
	return m.MigratedTo, true
}
