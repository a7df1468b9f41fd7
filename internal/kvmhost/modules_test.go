package kvmhost

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

// fakeModule builds a minimal ELF64 relocatable object whose only content
// is a .modinfo section with the given NUL-separated fields.
func fakeModule(fields ...string) []byte {
	var modinfo []byte
	for _, f := range fields {
		modinfo = append(append(modinfo, f...), 0)
	}
	shstrtab := []byte("\x00.modinfo\x00.shstrtab\x00")
	le := binary.LittleEndian
	const ehsize, shentsize = 64, 64
	dataOff := uint64(ehsize)
	strOff := dataOff + uint64(len(modinfo))
	shoff := (strOff + uint64(len(shstrtab)) + 7) &^ 7
	b := make([]byte, shoff+3*shentsize)
	copy(b, "\x7fELF\x02\x01\x01")
	le.PutUint16(b[16:], 1)  // ET_REL
	le.PutUint16(b[18:], 62) // EM_X86_64
	le.PutUint32(b[20:], 1)
	le.PutUint64(b[40:], shoff)
	le.PutUint16(b[52:], ehsize)
	le.PutUint16(b[58:], shentsize)
	le.PutUint16(b[60:], 3) // sections
	le.PutUint16(b[62:], 2) // .shstrtab
	copy(b[dataOff:], modinfo)
	copy(b[strOff:], shstrtab)
	section := func(i int, name, typ uint32, off, size uint64) {
		s := b[shoff+uint64(i)*shentsize:]
		le.PutUint32(s[0:], name)
		le.PutUint32(s[4:], typ)
		le.PutUint64(s[24:], off)
		le.PutUint64(s[32:], size)
		le.PutUint64(s[48:], 1)
	}
	section(1, 1, 1, dataOff, uint64(len(modinfo)))  // .modinfo, PROGBITS
	section(2, 10, 3, strOff, uint64(len(shstrtab))) // .shstrtab, STRTAB
	return b
}

func TestModuleDependsReadsModinfo(t *testing.T) {
	deps, err := moduleDepends(fakeModule("license=GPL", "depends=kvm,ccp", "name=kvm_amd"))
	if err != nil || !slices.Equal(deps, []string{"ccp", "kvm"}) {
		t.Fatalf("moduleDepends = %v, %v", deps, err)
	}
	if deps, err := moduleDepends(fakeModule("depends=")); err != nil || len(deps) != 0 {
		t.Fatalf("empty depends = %v, %v", deps, err)
	}
}

// TestModulesInDependencyOrder lays out a module tree as the .deb ships it,
// with compressed and uncompressed modules, and checks the archive holds
// exactly the KVM modules, the network card's driver, TAP and the bridge,
// uncompressed, in load order.
func TestModulesInDependencyOrder(t *testing.T) {
	dir := t.TempDir()
	write := func(rel string, b []byte) {
		p := filepath.Join(dir, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gz := func(b []byte) []byte {
		var buf bytes.Buffer
		w := gzip.NewWriter(&buf)
		w.Write(b)
		w.Close()
		return buf.Bytes()
	}
	kvmAMD := fakeModule("depends=kvm,ccp")
	write("kernel/arch/x86/kvm/kvm.ko", fakeModule("depends=irqbypass"))
	write("kernel/virt/lib/irqbypass.ko", fakeModule("depends="))
	write("kernel/drivers/crypto/ccp/ccp.ko.gz", gz(fakeModule("depends=")))
	write("kernel/drivers/unrelated/other.ko", fakeModule("depends="))
	write("kernel/drivers/net/ethernet/intel/e1000/e1000.ko", fakeModule("depends="))
	write("kernel/drivers/net/tun.ko", fakeModule("depends="))
	write("kernel/net/bridge/bridge.ko", fakeModule("depends=stp,llc"))
	write("kernel/net/802/stp.ko", fakeModule("depends=llc"))
	write("kernel/net/llc/llc.ko", fakeModule("depends="))
	write("kernel/drivers/net/vxlan/vxlan.ko", fakeModule("depends=udp_tunnel,ip6_udp_tunnel"))
	write("kernel/net/ipv4/udp_tunnel.ko", fakeModule("depends="))
	write("kernel/net/ipv6/ip6_udp_tunnel.ko", fakeModule("depends="))
	write("kernel/net/sched/sch_ingress.ko", fakeModule("depends="))
	write("kernel/drivers/net/veth.ko", fakeModule("depends="))
	write("kernel/net/sched/cls_bpf.ko", fakeModule("depends="))
	if _, err := exec.LookPath("xz"); err == nil {
		cmd := exec.Command("xz", "-c")
		cmd.Stdin = bytes.NewReader(kvmAMD)
		xzed, err := cmd.Output()
		if err != nil {
			t.Fatal(err)
		}
		write("kernel/arch/x86/kvm/kvm-amd.ko.xz", xzed)
	} else {
		write("kernel/arch/x86/kvm/kvm-amd.ko", kvmAMD)
	}
	dst := filepath.Join(t.TempDir(), "modules.cpio")
	order, err := writeModulesCPIO(context.Background(), dir, dst)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"irqbypass", "kvm", "ccp", "kvm_amd", "e1000", "tun", "llc", "stp", "bridge", "veth", "ip6_udp_tunnel", "udp_tunnel", "vxlan", "sch_ingress", "cls_bpf"}; !slices.Equal(order, want) {
		t.Fatalf("order = %v, want %v", order, want)
	}
	b, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, e := range parseCPIO(t, b) {
		if e.mode&0o170000 == cpioFile {
			files[e.name] = e.data
		}
	}
	if files["kvmhost/modules/order"] != "irqbypass\nkvm\nccp\nkvm_amd\ne1000\ntun\nllc\nstp\nbridge\nveth\nip6_udp_tunnel\nudp_tunnel\nvxlan\nsch_ingress\ncls_bpf\n" || len(files) != 16 {
		t.Fatalf("archive files %v", slices.Sorted(maps.Keys(files)))
	}
	if files["kvmhost/modules/kvm_amd.ko"] != string(kvmAMD) {
		t.Error("kvm_amd.ko was not stored uncompressed")
	}
}

func TestModulesMissingDependencyIsAnError(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "kvm.ko"), fakeModule("depends=irqbypass"), 0o644)
	os.WriteFile(filepath.Join(dir, "kvm-amd.ko"), fakeModule("depends=kvm"), 0o644)
	if _, err := writeModulesCPIO(context.Background(), dir, filepath.Join(t.TempDir(), "m.cpio")); err == nil {
		t.Fatal("no error for a missing irqbypass")
	}
}
