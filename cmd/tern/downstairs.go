package main

import (
	"errors"
	"fmt"
	"net"

	"github.com/VictoriaMetrics/metrics"
	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"tern/cmd/internal/serve"
	"tern/internal/telemetry"
	"tern/internal/tlsconf"
	"tern/internal/units"
	"tern/volume/downstairs"
	"tern/volume/extent"
)

func init() { rootCmd.AddCommand(newDownstairsCmd()) }

// newDownstairsCmd is `tern downstairs`: create and serve one replica.
func newDownstairsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "downstairs",
		Short: "Create and serve one replica of a region over QUIC with mutual TLS",
	}
	cmd.AddCommand(newDownstairsCreateCmd(), newDownstairsRunCmd())
	return cmd
}

func newDownstairsCreateCmd() *cobra.Command {
	var (
		dir         string
		blockSize   units.Bytes = 4096
		extentSize  units.Bytes = extent.DefaultExtentBytes
		extentCount uint32
		id          string
	)
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create a region directory and print its UUID",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			spec, err := createSpec(dir, uint64(blockSize), uint64(extentSize), extentCount, id)
			if err != nil {
				return err
			}
			if err := downstairs.Create(dir, spec); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), spec.UUID)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "region directory to create (required)")
	f.Var(&blockSize, "block-size", "block size in bytes: 512 or 4096")
	f.Var(&extentSize, "extent-size", "bytes per extent (e.g. 64MiB); a multiple of the block size")
	f.Uint32Var(&extentCount, "extent-count", 0, "number of extents (required)")
	f.StringVar(&id, "uuid", "", "region UUID, shared by the replicas of one volume (default: random)")
	return cmd
}

// createSpec validates the create flags, reporting every problem at once.
func createSpec(dir string, blockSize, extentSize uint64, extentCount uint32, id string) (extent.Spec, error) {
	var errs []error
	if dir == "" {
		errs = append(errs, errors.New("--dir is required"))
	}
	if extentCount == 0 {
		errs = append(errs, errors.New("--extent-count is required and must be positive"))
	}
	if blockSize != 512 && blockSize != 4096 {
		errs = append(errs, fmt.Errorf("--block-size %s: want 512B or 4KiB", units.FormatBytes(blockSize)))
	} else if extentSize == 0 || extentSize%blockSize != 0 {
		errs = append(errs, fmt.Errorf("--extent-size %s is not a positive multiple of the %s block size", units.FormatBytes(extentSize), units.FormatBytes(blockSize)))
	} else if extentSize/blockSize > 1<<32-1 {
		errs = append(errs, fmt.Errorf("--extent-size %s has too many blocks", units.FormatBytes(extentSize)))
	}
	region := uuid.New()
	if id != "" {
		var err error
		if region, err = uuid.Parse(id); err != nil {
			errs = append(errs, fmt.Errorf("--uuid: %w", err))
		}
	}
	if len(errs) > 0 {
		return extent.Spec{}, errors.Join(errs...)
	}
	spec := extent.NewSpec(uint32(blockSize), uint32(extentSize/blockSize), extentCount)
	spec.UUID = region
	if err := spec.Validate(); err != nil {
		return extent.Spec{}, err
	}
	return spec, nil
}

func newDownstairsRunCmd() *cobra.Command {
	var dir, listen, certs, metricsListen string
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Serve a region until SIGINT or SIGTERM",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var errs []error
			for _, f := range []struct{ name, value string }{{"--dir", dir}, {"--listen", listen}, {"--certs", certs}} {
				if f.value == "" {
					errs = append(errs, fmt.Errorf("%s is required", f.name))
				}
			}
			if err := errors.Join(errs...); err != nil {
				return err
			}
			log, err := newLogger(serve.ServerLogLevel)
			if err != nil {
				return err
			}
			bundle, err := tlsconf.Load(certs)
			if err != nil {
				return err
			}
			// main cancels the command context on SIGINT and SIGTERM.
			ctx := cmd.Context()
			set := metrics.NewSet()
			if metricsListen != "" {
				ln, err := net.Listen("tcp", metricsListen)
				if err != nil {
					return fmt.Errorf("listen for metrics: %w", err)
				}
				ms := telemetry.ServeMetrics(ln, set)
				defer ms.Close()
				log.Info("serving metrics", "component", "downstairs", "addr", ln.Addr().String())
			}
			return downstairs.Run(ctx, downstairs.Config{
				Dir:     dir,
				Listen:  listen,
				TLS:     bundle.ServerConfig(),
				Logger:  log,
				Metrics: set,
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "region directory (required)")
	f.StringVar(&listen, "listen", "", "UDP address to serve QUIC on, host:port (required)")
	f.StringVar(&certs, "certs", "", "certificate directory from `tern certs init` (required)")
	f.StringVar(&metricsListen, "metrics-listen", "", "TCP address to serve Prometheus /metrics on (default: off)")
	return cmd
}
