package acpi

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The tests here hand the tables to ACPICA's tools (Debian: acpica-tools),
// the same ACPI code Linux runs: iasl disassembles each table and
// acpiexec loads the DSDT into a namespace and decodes every device's
// resources. The RSDP has no standalone form those tools read; the unit
// tests check it, and Linux finds it (vmm's TestLinuxBootsToInit).

// needACPICA returns the path of tool, skipping the test where it is not
// installed, except in CI, where that is a failure.
func needACPICA(t *testing.T, tool string) string {
	t.Helper()
	p, err := exec.LookPath(tool)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not installed (.ci/run installs acpica-tools): %v", tool, err)
		}
		t.Skipf("%s is not installed (Debian: apt-get install acpica-tools): %v", tool, err)
	}
	return p
}

// runACPICA runs a tool in dir and returns its output, failing the test
// if it fails or reports an error or warning on any line but those
// containing allowed.
func runACPICA(t *testing.T, dir string, allowed []string, tool string, args ...string) string {
	t.Helper()
	cmd := exec.Command(tool, args...)
	cmd.Dir = dir
	done := make(chan struct{})
	timer := time.AfterFunc(time.Minute, func() {
		select {
		case <-done:
		default:
			cmd.Process.Kill()
		}
	})
	out, err := cmd.CombinedOutput()
	close(done)
	timer.Stop()
	s := string(out)
	if err != nil {
		t.Fatalf("%s %s: %v; it printed:\n%s", filepath.Base(tool), strings.Join(args, " "), err, s)
	}
lines:
	for _, line := range strings.Split(s, "\n") {
		for _, a := range allowed {
			if strings.Contains(line, a) {
				continue lines
			}
		}
		for _, bad := range []string{"Error", "Warning", "Incorrect", "mismatch", "AE_"} {
			if strings.Contains(line, bad) {
				t.Fatalf("%s %s reports %q:\n%s", filepath.Base(tool), strings.Join(args, " "), line, s)
			}
		}
	}
	return s
}

// squash collapses runs of white space, so iasl's column layout does not
// matter to the checks.
func squash(s string) string { return strings.Join(strings.Fields(s), " ") }

// acpicaSpec has two CPUs, COM1, a disk in slot 0 and a network card in
// slot 9: the shape of a Linux guest tern runs.
var acpicaSpec = Spec{
	VCPUs:   2,
	Serials: []Serial{{Port: 0x3f8, GSI: 4}},
	VirtioMMIO: []VirtioMMIO{
		{Slot: 0, Base: 0xfeb00000, Size: 0x200, GSI: 16},
		{Slot: 9, Base: 0xfeb01200, Size: 0x200, GSI: 7},
	},
	Power: &Power{SleepControl: 0x600, SleepStatus: 0x601, Reset: 0x602, ResetValue: 1, S5Type: 5},
}

// writeTables writes each table but the RSDP to dir as SIG.dat.
func writeTables(t *testing.T, dir string, img *Image) []string {
	t.Helper()
	var sigs []string
	for _, tb := range img.Tables[1:] {
		if err := os.WriteFile(filepath.Join(dir, tb.Signature+".dat"), tb.Bytes, 0o644); err != nil {
			t.Fatal(err)
		}
		sigs = append(sigs, tb.Signature)
	}
	return sigs
}

func TestIASLDisassemblesEveryTable(t *testing.T) {
	iasl := needACPICA(t, "iasl")
	img, err := Build(RSDPScanStart, acpicaSpec)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	dsl := map[string]string{}
	for _, sig := range writeTables(t, dir, img) {
		runACPICA(t, dir, nil, iasl, "-d", sig+".dat")
		b, err := os.ReadFile(filepath.Join(dir, sig+".dsl"))
		if err != nil {
			t.Fatalf("iasl -d %s.dat wrote no disassembly: %v", sig, err)
		}
		dsl[sig] = squash(string(b))
	}
	addr := func(sig string) uint64 {
		for _, tb := range img.Tables {
			if tb.Signature == sig {
				return tb.Addr
			}
		}
		t.Fatalf("no %s", sig)
		return 0
	}
	want := map[string][]string{
		"XSDT": {
			fmt.Sprintf("ACPI Table Address 0 : %016X", addr("FACP")),
			fmt.Sprintf("ACPI Table Address 1 : %016X", addr("APIC")),
		},
		"FACP": {
			"Revision : 06",
			"Hardware Reduced (V5) : 1",
			"VGA Not Present (V4) : 1",
			"CMOS RTC Not Present (V5) : 1",
			"8042 Present on ports 60/64 (V2) : 0",
			fmt.Sprintf("DSDT Address : %016X", addr("DSDT")),
			"Reset Register Supported (V2) : 1",
			"Reset Register : [Generic Address Structure] [074h 0116 1] Space ID : 01 [SystemIO] [075h 0117 1] Bit Width : 08 [076h 0118 1] Bit Offset : 00 [077h 0119 1] Encoded Access Width : 01 [Byte Access:8] [078h 0120 8] Address : 0000000000000602",
			"Value to cause reset : 01",
			"Sleep Control Register : [Generic Address Structure] [0F4h 0244 1] Space ID : 01 [SystemIO] [0F5h 0245 1] Bit Width : 08 [0F6h 0246 1] Bit Offset : 00 [0F7h 0247 1] Encoded Access Width : 01 [Byte Access:8] [0F8h 0248 8] Address : 0000000000000600",
			"Sleep Status Register : [Generic Address Structure] [100h 0256 1] Space ID : 01 [SystemIO] [101h 0257 1] Bit Width : 08 [102h 0258 1] Bit Offset : 00 [103h 0259 1] Encoded Access Width : 01 [Byte Access:8] [104h 0260 8] Address : 0000000000000601",
		},
		"APIC": {
			"Local Apic Address : FEE00000",
			"Subtable Type : 00 [Processor Local APIC] [02Dh 0045 1] Length : 08 [02Eh 0046 1] Processor ID : 00 [02Fh 0047 1] Local Apic ID : 00 [030h 0048 4] Flags (decoded below) : 00000001 Processor Enabled : 1",
			"Subtable Type : 00 [Processor Local APIC] [035h 0053 1] Length : 08 [036h 0054 1] Processor ID : 01 [037h 0055 1] Local Apic ID : 01 [038h 0056 4] Flags (decoded below) : 00000001 Processor Enabled : 1",
			"Subtable Type : 01 [I/O APIC] [03Dh 0061 1] Length : 0C [03Eh 0062 1] I/O Apic ID : 02 [03Fh 0063 1] Reserved : 00 [040h 0064 4] Address : FEC00000 [044h 0068 4] Interrupt : 00000000",
		},
		"DSDT": {
			`Name (_S5, Package (0x04) // _S5_: S5 System State { 0x05, 0x05, Zero, Zero })`,
			`Device (COM1) { Name (_HID, EisaId ("PNP0501") /* 16550A-compatible COM Serial Port */) // _HID: Hardware ID Name (_UID, One) // _UID: Unique ID Name (_CRS, ResourceTemplate () // _CRS: Current Resource Settings { IO (Decode16, 0x03F8, // Range Minimum 0x03F8, // Range Maximum 0x00, // Alignment 0x08, // Length ) Interrupt (ResourceConsumer, Edge, ActiveHigh, Exclusive, ,, ) { 0x00000004, } }) }`,
			`Device (VR00) { Name (_HID, "LNRO0005") // _HID: Hardware ID Name (_UID, Zero) // _UID: Unique ID Name (_CRS, ResourceTemplate () // _CRS: Current Resource Settings { Memory32Fixed (ReadWrite, 0xFEB00000, // Address Base 0x00000200, // Address Length ) Interrupt (ResourceConsumer, Edge, ActiveHigh, Exclusive, ,, ) { 0x00000010, } }) }`,
			`Device (VR09) { Name (_HID, "LNRO0005") // _HID: Hardware ID Name (_UID, 0x09) // _UID: Unique ID Name (_CRS, ResourceTemplate () // _CRS: Current Resource Settings { Memory32Fixed (ReadWrite, 0xFEB01200, // Address Base 0x00000200, // Address Length ) Interrupt (ResourceConsumer, Edge, ActiveHigh, Exclusive, ,, ) { 0x00000007, } }) }`,
		},
	}
	for sig, lines := range want {
		for _, w := range lines {
			if !strings.Contains(dsl[sig], w) {
				t.Errorf("iasl's %s does not show\n\t%s\nit is:\n%s", sig, w, dsl[sig])
			}
		}
	}
	if n := strings.Count(dsl["APIC"], "[Processor Local APIC]"); n != 2 {
		t.Errorf("iasl's MADT has %d local APICs, want 2", n)
	}
	if n := strings.Count(dsl["DSDT"], "Device ("); n != 3 {
		t.Errorf("iasl's DSDT has %d devices, want 3", n)
	}
}

func TestACPIExecDecodesEveryDevicesResources(t *testing.T) {
	acpiexec := needACPICA(t, "acpiexec")
	spec := twelveSlots(4)
	spec.Power = acpicaSpec.Power
	img, err := Build(RSDPScanStart, spec)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writeTables(t, dir, img)
	var cmds []string
	for _, d := range spec.VirtioMMIO {
		cmds = append(cmds, fmt.Sprintf(`evaluate \_SB.VR%02X._HID`, d.Slot), fmt.Sprintf(`resources \_SB.VR%02X`, d.Slot))
	}
	cmds = append(cmds, `resources \_SB.COM1`, `evaluate \_S5`)
	// acpiexec builds its own RSDP and XSDT around the tables given; the
	// FADT leads it to the DSDT. Its "resources" command decodes _CRS with
	// ACPICA's resource manager (what Linux's acpi_walk_resources uses),
	// encodes the result again and compares: a mismatch fails runACPICA.
	// It then tries _SRS, which tern's fixed devices do not have.
	out := squash(runACPICA(t, dir, []string{"AcpiSetCurrentResources failed: AE_NOT_FOUND"},
		acpiexec, "-b", strings.Join(cmds, ";"), "FACP.dat", "DSDT.dat", "APIC.dat"))
	irq := func(gsi uint32) string {
		return fmt.Sprintf("Extended IRQ Resource Type : ResourceConsumer Triggering : Edge Polarity : ActiveHigh Sharing : Exclusive Resource Source Index : 00 Resource Source : [Not Specified] Interrupt Count : 01 Dword00 : %08X", gsi)
	}
	var want []string
	for _, d := range spec.VirtioMMIO {
		want = append(want,
			fmt.Sprintf(`Evaluating \_SB.VR%02X._HID`, d.Slot), `[String] Length 08 = "LNRO0005"`,
			fmt.Sprintf("32-Bit Fixed Memory Range Resource Write Protect : ReadWrite Address : %08X Address Length : %08X", d.Base, d.Size),
			irq(d.GSI), "EndTag Resource")
	}
	want = append(want, "I/O Resource Address Decoding : Decode16 Address Minimum : 03F8 Address Maximum : 03F8 Alignment : 00 Address Length : 08", irq(4),
		// What Linux's acpi_get_sleep_type_data reads for poweroff.
		`Evaluating \_S5`, "[Package] Contains 4 Elements: [Integer] = 0000000000000005 [Integer] = 0000000000000005")
	rest := out
	for _, w := range want {
		i := strings.Index(rest, w)
		if i < 0 {
			t.Fatalf("acpiexec's output does not show, next,\n\t%s\nit printed:\n%s", w, out)
		}
		rest = rest[i+len(w):]
	}
}
