package layering

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// rules is tern's layering, the one place it is written down as code
// (docs/ARCHITECTURE.md draws the same picture). Each rule says which
// packages (from) may not import which (mayNot), with exceptions on both
// sides. Paths are relative to the module; "x/..." is x and everything
// under it, "..." every package. A rule with tests set also holds for the
// imports of the packages' _test.go files.
var rules = []rule{
	{
		from: []string{"volume/..."}, mayNot: []string{"vmm/...", "migration/...", "bench/...", "cmd/..."}, tests: true,
		why: "the volume knows nothing of VMs, migration or the commands; a VM reaches a volume through vmm/blockio.Device, which every volume.Volume satisfies",
	},
	{
		from: []string{"volume/upstairs/...", "volume/downstairs", "volume/extent", "volume/wire", "volume/transport", "volume/reconcile"}, mayNot: []string{"volume/ec"}, tests: true,
		why: "the erasure-coded volume is built on the parts the layouts share (wire, transport, downstairs, progress), not the other way round",
	},
	{
		from: []string{"volume/ec"}, mayNot: []string{"volume/upstairs/..."}, tests: true,
		why: "the two layouts are siblings: what they share (errors, defaults, the Volume interface) is the volume package's",
	},
	{
		from: []string{"volume/dsclient"}, mayNot: []string{"..."}, except: []string{"volume", "volume/ids", "volume/wire", "volume/transport"},
		why: "the downstairs client is the session's client end over the protocol and the transport; what a session is for (a layout, a probe) sits above it",
	},
	{
		from: []string{"volume/downstairs", "volume/wire", "volume/transport", "volume/extent"}, mayNot: []string{"volume/dsclient"}, tests: true,
		why: "the server, the protocol and the transport sit under the client of a session, not beside it",
	},
	{
		from: []string{"volume/..."}, exceptFrom: []string{"volume/layout", "volume/sim", "volume/chaos"}, mayNot: []string{"volume/layout"}, tests: true,
		why: "volume/layout is the one place that picks a layout; it sits above both (the simulator and fault campaigns may open a volume through it)",
	},
	{
		from: []string{"..."}, exceptFrom: []string{"tools/..."}, mayNot: []string{"tools/..."}, tests: true,
		why: "tools/ holds the kvmhost command and its self-test; what tern or its tests use lives in vmm/guests or internal/",
	},
	{
		from: []string{"internal/..."}, mayNot: []string{"..."}, except: []string{"internal/...", "vmm/kvm"},
		why: "internal/ holds what every layer shares (TLS, telemetry, units, the emulated test host); it sits under all of them (kvmhost uses kvm.Probe)",
	},
	{
		from: []string{"..."}, mayNot: []string{"internal/testwait"},
		why: "testwait is how tests wait; no production package waits that way",
	},
	{
		from: []string{"vmm/kvm"}, mayNot: []string{"..."},
		why: "vmm/kvm is the KVM ioctl layer, the bottom of the VMM",
	},
	{
		from: []string{"vmm/acpi"}, mayNot: []string{"..."},
		why: "the ACPI tables are a pure builder over plain data (no KVM, guest memory or IO); vmm places the bytes",
	},
	{
		from:   []string{"vmm", "vmm/vcpu", "vmm/devices", "vmm/boot", "vmm/memory", "vmm/kvm", "vmm/acpi", "vmm/guests/..."},
		mayNot: []string{"volume/...", "migration/...", "instance", "instance/api", "instance/client"},
		why:    "the VM is built from devices, vCPUs and memory; disks are blockio.Device, and the controller, API and migration sit above it",
	},
	{
		from:   []string{"volume/ids", "volume/wire", "volume/reconcile", "volume/upstairs/engine"},
		mayNot: []string{"..."}, except: []string{"volume", "volume/ids", "volume/wire", "volume/reconcile", "volume/internal/fixes"},
		why: "the protocol and the decision cores are plain data: no sockets, files or clocks (those are in their drivers); they share the volume package's errors, and volume/internal/fixes lets a test undo a past fix in them",
	},
	{
		from: []string{"volume"}, mayNot: []string{"..."}, except: []string{"volume/ids", "volume/reconcile", "volume/wire", "volume/internal/fixes", "internal/blockio"},
		why: "the volume vocabulary (the Volume interface over internal/blockio.Device, shared errors and defaults) is plain data every layout and the cores build on",
	},
	{
		from: []string{"volume/internal/fixes"}, mayNot: []string{"..."},
		why: "the undoable fixes are a table of flags the decision cores read; it imports nothing of tern",
	},
	{
		from: []string{"migration"}, mayNot: []string{"instance", "instance/api", "instance/client", "instance/runner", "bench/...", "cmd/..."},
		why: "the migration protocol and engines sit under the instance controller that drives them; they see the VM through vmm's migration.go",
	},
	{
		from: []string{"vmm/..."}, mayNot: []string{"instance/runner"}, tests: true,
		why: "the runner drives two VMMs through their APIs; the VMM does not know it",
	},
	{
		from: []string{"instance/apiv1"}, mayNot: []string{"..."}, except: []string{"volume/ids"}, tests: true,
		why: "the instance API's contract is plain types: it imports nothing of tern but the volume's id types, so whoever speaks the API links no controller, engine, VMM or volume",
	},
	{
		from:   []string{"instance/client", "instance/runner"},
		mayNot: []string{"..."}, except: []string{"instance/apiv1", "instance/client", "volume/ids"},
		why: "a client of the instance API links its contract (instance/apiv1), never the controller, the API server, the migration engines, the VMM or the volume",
	},
	{
		from:   []string{"agent/agentapi"},
		mayNot: []string{"..."}, except: []string{"instance/apiv1", "instance/client", "volume/ids"},
		why: "the agent's contract is its API's bodies and client; it links the instance contract and client only, never the agent, its data plane or the VMM",
	},
	{
		from:   []string{"control", "control/quorum"},
		mayNot: []string{"vmm/...", "migration", "instance", "instance/api", "volume/...", "dataplane/...", "agent"}, except: []string{"volume/ids"},
		why: "the control plane speaks to agents and vmms through their contracts (agent/agentapi, instance/apiv1, instance/client, instance/runner); it links no VMM, migration engine, volume or data plane",
	},
	{
		from: []string{"..."}, exceptFrom: []string{"control/...", "cmd/tern-control"}, mayNot: []string{"control/..."}, except: []string{"control/controlapi"},
		why: "the control plane is the top of the house and its own binary: only tern-control runs it, and others speak to it through its contract (control/controlapi), so etcd links into no other process",
	},
	{
		from: []string{"control/controlapi"}, mayNot: []string{"..."}, except: []string{"instance/apiv1", "volume/ids"}, tests: true,
		why: "the control plane's contract is plain types: whoever speaks the control API links no etcd, agent, VMM or volume",
	},
	{
		from: []string{"..."}, exceptFrom: []string{"agent", "cmd/tern-agent"}, mayNot: []string{"agent"},
		why: "the host agent sits under the control plane and above the vmm processes it spawns; nothing below knows it",
	},
	{
		from: []string{"dataplane/..."}, exceptFrom: []string{"dataplane/vmtest"}, mayNot: []string{"..."}, except: []string{"dataplane/...", "internal/..."}, tests: true,
		why: "the network data plane knows programs, maps and devices, not VMs, migration or the control plane; the agent drives it (dataplane/vmtest, tests only, migrates real VMs across it)",
	},
	{
		from: []string{"..."}, exceptFrom: []string{"cmd/tern-bench", "bench/..."}, mayNot: []string{"bench/..."},
		why: "bench holds the scenarios behind `tern bench`; only tern-bench runs them",
	},
	{
		from:   []string{"cmd/tern", "cmd/internal/..."},
		mayNot: []string{"control", "agent", "dataplane/...", "bench/...", "volume/sim", "volume/chaos", "volume/internal/fixes"},
		why:    "the tern binary runs the vmm, downstairs and CLI processes: it links no control plane (etcd), agent (eBPF), benchmark or simulator; those are the tern-control, tern-agent and tern-bench binaries it execs",
	},
	{
		from: []string{"..."}, exceptFrom: []string{"vmm/linuxtest"}, mayNot: []string{"vmm/kvm/kvmtest"},
		why: "kvmtest is test tooling: only tests (and the Linux test helper) use it",
	},
}

// rule forbids packages matching from (but not exceptFrom) to import
// packages matching mayNot (but not except).
type rule struct {
	from, exceptFrom []string
	mayNot, except   []string
	tests            bool
	why              string
}

// pkg is one package of the module as `go list -json` describes it.
type pkg struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

const module = "tern"

func TestLayering(t *testing.T) {
	pkgs, err := listModule()
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found %d packages of %s: not run from inside the module?", len(pkgs), module)
	}
	for _, v := range violations(pkgs, rules) {
		t.Error(v)
	}
}

// TestRulesCatchABadImport checks the checker on a made-up graph: a
// volume package that imports the VMM is reported in one line naming both.
func TestRulesCatchABadImport(t *testing.T) {
	pkgs := []pkg{
		{ImportPath: "tern/volume/wire", Imports: []string{"tern/volume/ids", "tern/vmm/kvm", "fmt"}},
		{ImportPath: "tern/vmm/kvm", Imports: []string{"golang.org/x/sys/unix"}},
		{ImportPath: "tern/tools/kvmhost/cmd/kvmhost", Imports: []string{"tern/internal/kvmhost"}},
		{ImportPath: "tern/vmm", TestImports: []string{"tern/volume/upstairs"}},
	}
	got := violations(pkgs, rules)
	want := []string{"volume/wire imports vmm/kvm: " + rules[0].why}
	if !slices.Equal(got, want) {
		t.Fatalf("violations:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// violations returns one line per import that breaks a rule, naming both
// packages and the first rule it breaks.
func violations(pkgs []pkg, rules []rule) []string {
	var out []string
	for _, p := range pkgs {
		from, ok := inModule(p.ImportPath)
		if !ok {
			continue
		}
		seen := map[string]bool{}
		for i, imp := range slices.Concat(p.Imports, p.TestImports, p.XTestImports) {
			to, ok := inModule(imp)
			if !ok || to == from || seen[to] {
				continue
			}
			seen[to] = true
			fromTest := i >= len(p.Imports)
			for _, r := range rules {
				if fromTest && !r.tests || !r.forbids(from, to) {
					continue
				}
				out = append(out, fmt.Sprintf("%s imports %s: %s", from, to, r.why))
				break
			}
		}
	}
	return out
}

// forbids reports whether r forbids package from to import package to.
func (r rule) forbids(from, to string) bool {
	return matchAny(r.from, from) && !matchAny(r.exceptFrom, from) &&
		matchAny(r.mayNot, to) && !matchAny(r.except, to)
}

// inModule returns path relative to the module, or false for a package
// outside it.
func inModule(path string) (string, bool) {
	rel, ok := strings.CutPrefix(path, module+"/")
	return rel, ok
}

// matchAny reports whether path matches one of patterns ("x/..." is x and
// everything under it, "..." everything).
func matchAny(patterns []string, path string) bool {
	for _, p := range patterns {
		if p == "..." || p == path {
			return true
		}
		if base, ok := strings.CutSuffix(p, "/..."); ok && (path == base || strings.HasPrefix(path, base+"/")) {
			return true
		}
	}
	return false
}

// listModule runs `go list -json ./...` from the module's root.
func listModule() ([]pkg, error) {
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		return nil, fmt.Errorf("finding the module root: %w", err)
	}
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports,TestImports,XTestImports", "./...")
	cmd.Dir = strings.TrimSpace(string(root))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("listing packages: %w\n%s", err, stderr.String())
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			return pkgs, nil
		} else if err != nil {
			return nil, fmt.Errorf("decoding go list output: %w", err)
		}
		pkgs = append(pkgs, p)
	}
}
