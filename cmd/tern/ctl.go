package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"tern/control/controlapi"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"tern/cmd/internal/serve"
	"tern/instance/apiv1"
	"tern/internal/tlsconf"
	"tern/internal/units"
)

func init() { rootCmd.AddCommand(newCtlCmd()) }

// ctlFlags are tern ctl's global flags.
type ctlFlags struct {
	control, certs string
	json           bool
}

func (f *ctlFlags) do(ctx context.Context, method, path string, body, out any) error {
	base := f.control
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	hc := &http.Client{}
	if f.certs != "" {
		b, err := tlsconf.Load(f.certs)
		if err != nil {
			return fmt.Errorf("loading certificates: %w", err)
		}
		hc.Transport = &http.Transport{TLSClientConfig: b.ClientConfig("")}
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(base, "/")+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("reaching the control plane: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		var e apiv1.Error
		if json.Unmarshal(b, &e) == nil && e.Message != "" {
			return fmt.Errorf("%s: %s", e.ErrorCode, e.Message)
		}
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(b)))
	}
	if out != nil && len(b) > 0 {
		return json.Unmarshal(b, out)
	}
	return nil
}

// print writes v as JSON with --json, else as the table rows gives.
func (f *ctlFlags) print(w io.Writer, v any, header string, rows func(tw io.Writer)) error {
	if f.json {
		return json.NewEncoder(w).Encode(v)
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	rows(tw)
	return tw.Flush()
}

func newCtlCmd() *cobra.Command {
	f := &ctlFlags{}
	cmd := &cobra.Command{Use: "ctl", Short: "The operator CLI of the control plane (tern control)"}
	def := serve.DefaultControlAddr
	if v := os.Getenv("TERN_CONTROL"); v != "" {
		def = v
	}
	cmd.PersistentFlags().StringVar(&f.control, "control", def, "the control plane's URL (default $TERN_CONTROL or "+serve.DefaultControlAddr+")")
	cmd.PersistentFlags().StringVar(&f.certs, "certs", "", "certificate directory for a control plane serving --api-tls")
	cmd.PersistentFlags().BoolVar(&f.json, "json", false, "print JSON: list prints one array, get one object")
	cmd.AddCommand(newCtlHostCmd(f), newCtlInstanceCmd(f), newCtlMigrationCmd(f))
	return cmd
}

func newCtlHostCmd(f *ctlFlags) *cobra.Command {
	cmd := &cobra.Command{Use: "host", Short: "Hosts: list, drain"}
	cmd.AddCommand(&cobra.Command{
		Use: "list", Short: "List the hosts", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var hosts []controlapi.HostView
			if err := f.do(cmd.Context(), http.MethodGet, "/v1/hosts", nil, &hosts); err != nil {
				return err
			}
			return f.print(cmd.OutOrStdout(), hosts, "ID\tADDRESS\tSTATE\tVMMS\tCPUS\tMEMORY", func(w io.Writer) {
				for _, h := range hosts {
					fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%s\n", h.ID, h.Address, h.State, h.VMMs, h.CPUs, units.Bytes(h.MemoryMiB<<20))
				}
			})
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use: "drain HOST", Short: "Live-migrate every instance off HOST; exits 0 once it runs no vmm", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return ctlDrain(cmd, f, args[0]) },
	})
	return cmd
}

// ctlDrain starts the drain and follows it: a bar on a terminal, JSON
// lines otherwise.
func ctlDrain(cmd *cobra.Command, f *ctlFlags, host string) error {
	ctx := cmd.Context()
	var d controlapi.Drain
	if err := f.do(ctx, http.MethodPost, "/v1/hosts/"+url.PathEscape(host)+"/drain", nil, &d); err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	isTTY := false
	if fl, ok := out.(*os.File); ok {
		isTTY = term.IsTerminal(int(fl.Fd()))
	}
	var bar *progressbar.ProgressBar
	enc := json.NewEncoder(out)
	rev := int64(0)
	for {
		if err := f.do(ctx, http.MethodGet, "/v1/hosts/"+url.PathEscape(host)+"/drain?after_rev="+strconv.FormatInt(rev, 10), nil, &d); err != nil {
			return err
		}
		if d.Rev == rev && d.State == "running" {
			continue
		}
		rev = d.Rev
		if isTTY {
			if bar == nil {
				bar = progressbar.NewOptions(len(d.Plan), progressbar.OptionSetWriter(out), progressbar.OptionSetDescription("draining "+host))
			}
			bar.Set(d.Moved)
		} else {
			enc.Encode(map[string]any{"host": host, "state": d.State, "moved": d.Moved, "total": len(d.Plan), "migrations": d.Migrations, "error": d.Error})
		}
		switch d.State {
		case "done":
			if bar != nil {
				bar.Finish()
				fmt.Fprintf(out, "\nhost %s drained: %d instances moved\n", host, d.Moved)
			}
			return nil
		case "failed":
			return fmt.Errorf("draining host %s: %s", host, d.Error)
		}
	}
}

func instanceRows(list []controlapi.InstanceView) func(io.Writer) {
	return func(w io.Writer) {
		for _, i := range list {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\n", i.Name, i.ID, i.State, i.Host, i.VCPUs, units.Bytes(i.MemoryMiB<<20))
		}
	}
}

const instanceHeader = "NAME\tID\tSTATE\tHOST\tVCPUS\tMEMORY"

func newCtlInstanceCmd(f *ctlFlags) *cobra.Command {
	cmd := &cobra.Command{Use: "instance", Short: "Instances: create, list, get, start, stop, delete, migrate"}
	var (
		guest   string
		vcpus   int
		memory  = units.Bytes(64 << 20)
		volume  = units.Bytes(64 << 20)
		noStart bool
		params  []string
		to      string
	)
	create := &cobra.Command{
		Use: "create NAME --guest NAME|FILE [--vcpus N] [--memory SIZE] [--volume SIZE] [--no-start]", Short: "Create an instance on a volume across three hosts, and start it",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if guest == "" {
				return errors.New("--guest is required")
			}
			g := apiv1.GuestSpec{Kind: apiv1.GuestELF, Path: guest}
			for _, p := range params {
				k, v, ok := strings.Cut(p, "=")
				n, err := strconv.ParseUint(v, 10, 64)
				if !ok || err != nil {
					return fmt.Errorf("--param %q: want KEY=NUMBER", p)
				}
				if g.Params == nil {
					g.Params = map[string]uint64{}
				}
				g.Params[k] = n
			}
			var v controlapi.InstanceView
			req := controlapi.CreateInstance{Name: args[0], VCPUs: vcpus, MemoryMiB: uint64(memory) >> 20, Guest: g, VolumeBytes: uint64(volume), Start: !noStart}
			if err := f.do(cmd.Context(), http.MethodPost, "/v1/instances", req, &v); err != nil {
				return err
			}
			return f.print(cmd.OutOrStdout(), v, instanceHeader, instanceRows([]controlapi.InstanceView{v}))
		},
	}
	create.Flags().StringVar(&guest, "guest", "", "a built-in guest's name (tern guests) or an ELF file on every host")
	create.Flags().IntVar(&vcpus, "vcpus", 1, "vCPUs")
	create.Flags().Var(&memory, "memory", "guest memory")
	create.Flags().Var(&volume, "volume", "the volume's size (0: none), a multiple of 1MiB")
	create.Flags().BoolVar(&noStart, "no-start", false, "create it stopped")
	create.Flags().StringArrayVar(&params, "param", nil, "a built-in guest's parameter KEY=NUMBER (repeatable)")
	list := &cobra.Command{Use: "list", Short: "List the instances", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var l []controlapi.InstanceView
			if err := f.do(cmd.Context(), http.MethodGet, "/v1/instances", nil, &l); err != nil {
				return err
			}
			return f.print(cmd.OutOrStdout(), l, instanceHeader, instanceRows(l))
		}}
	one := func(use, short, method, suffix string) *cobra.Command {
		return &cobra.Command{Use: use + " NAME", Short: short, Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				var v controlapi.InstanceView
				if err := f.do(cmd.Context(), method, "/v1/instances/"+url.PathEscape(args[0])+suffix, nil, &v); err != nil {
					return err
				}
				if method == http.MethodDelete {
					fmt.Fprintf(cmd.OutOrStdout(), "deleted %s\n", args[0])
					return nil
				}
				return f.print(cmd.OutOrStdout(), v, instanceHeader, instanceRows([]controlapi.InstanceView{v}))
			}}
	}
	migrate := &cobra.Command{Use: "migrate NAME [--to HOST]", Short: "Live-migrate an instance to HOST (placement chooses by default) and wait for the end",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var sg controlapi.MigrateSaga
			if err := f.do(cmd.Context(), http.MethodPost, "/v1/instances/"+url.PathEscape(args[0])+"/migrate", controlapi.MigrateRequest{To: to}, &sg); err != nil {
				return err
			}
			m, err := ctlWaitMigration(cmd.Context(), f, sg.MigrationID)
			if err != nil {
				return err
			}
			if f.json {
				json.NewEncoder(cmd.OutOrStdout()).Encode(m)
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "migration %s %s: %s → %s, total %.1f ms, downtime %.1f ms, %s sent\n",
					m.ID, m.State, m.SourceHost, m.TargetHost, m.TotalMs, m.DowntimeMs, units.Bytes(m.BytesSent))
			}
			if m.State != controlapi.MigrationCompleted {
				return fmt.Errorf("migration %s failed: %s", m.ID, m.Error)
			}
			return nil
		}}
	migrate.Flags().StringVar(&to, "to", "", "the host to migrate to")
	cmd.AddCommand(create, list, one("get", "Show an instance", http.MethodGet, ""),
		one("start", "Start an instance on a host placement chooses", http.MethodPost, "/start"),
		one("stop", "Stop an instance; returns once its vmm is gone", http.MethodPost, "/stop"),
		one("delete", "Stop an instance and delete it with its volume", http.MethodDelete, ""), migrate)
	return cmd
}

// ctlWaitMigration follows a migration's record until it ends.
func ctlWaitMigration(ctx context.Context, f *ctlFlags, id string) (controlapi.Migration, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	var rev int64
	for {
		var m controlapi.Migration
		path := "/v1/migrations/" + url.PathEscape(id) + "?after_rev=" + strconv.FormatInt(rev, 10)
		if err := f.do(ctx, http.MethodGet, path, nil, &m); err != nil {
			return m, fmt.Errorf("waiting for migration %s: %w", id, err)
		}
		if m.State == controlapi.MigrationCompleted || m.State == controlapi.MigrationFailed {
			return m, nil
		}
		rev = m.Rev
	}
}

func newCtlMigrationCmd(f *ctlFlags) *cobra.Command {
	cmd := &cobra.Command{Use: "migration", Short: "Migrations: list, get"}
	rows := func(l []controlapi.Migration) func(io.Writer) {
		return func(w io.Writer) {
			for _, m := range l {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%.1f\t%.1f\n", m.ID, m.State, m.SourceHost, m.TargetHost, m.TotalMs, m.DowntimeMs)
			}
		}
	}
	const header = "ID\tSTATE\tFROM\tTO\tTOTAL_MS\tDOWNTIME_MS"
	cmd.AddCommand(&cobra.Command{Use: "list", Short: "List migrations", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var l []controlapi.Migration
			if err := f.do(cmd.Context(), http.MethodGet, "/v1/migrations", nil, &l); err != nil {
				return err
			}
			return f.print(cmd.OutOrStdout(), l, header, rows(l))
		}}, &cobra.Command{Use: "get ID", Short: "Show a migration", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var m controlapi.Migration
			if err := f.do(cmd.Context(), http.MethodGet, "/v1/migrations/"+url.PathEscape(args[0]), nil, &m); err != nil {
				return err
			}
			return f.print(cmd.OutOrStdout(), m, header, rows([]controlapi.Migration{m}))
		}})
	return cmd
}
