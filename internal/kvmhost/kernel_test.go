package kvmhost

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeApt puts an apt-cache and an apt-get on PATH that behave as on a
// machine whose package lists are missing until `apt-get update` runs.
func fakeApt(t *testing.T) (updated string) {
	dir := t.TempDir()
	updated = filepath.Join(dir, "updated")
	scripts := map[string]string{
		"apt-cache": "#!/bin/sh\nif [ -f " + updated + " ]; then echo linux-image-amd64; echo '  Depends: linux-image-9.9.9-1-amd64'; " +
			"else echo 'E: No packages found' >&2; exit 100; fi\n",
		"apt-get": "#!/bin/sh\n[ \"$1\" = update ] && touch " + updated + "\n",
	}
	for name, body := range scripts {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv(KernelEnv, "")
	return updated
}

func TestKernelPackageUpdatesMissingListsAsRoot(t *testing.T) {
	updated := fakeApt(t)
	geteuid = func() int { return 0 }
	t.Cleanup(func() { geteuid = os.Geteuid })
	pkg, err := KernelPackage(context.Background())
	if err != nil || pkg != "linux-image-9.9.9-1-amd64" {
		t.Fatalf("KernelPackage = %q, %v", pkg, err)
	}
	if _, err := os.Stat(updated); err != nil {
		t.Fatal("apt-get update did not run")
	}
}

func TestKernelPackageSaysWhatToRunWhenNotRoot(t *testing.T) {
	updated := fakeApt(t)
	geteuid = func() int { return 1000 }
	t.Cleanup(func() { geteuid = os.Geteuid })
	_, err := KernelPackage(context.Background())
	if err == nil || !strings.Contains(err.Error(), "run `sudo apt-get update`") {
		t.Fatalf("KernelPackage = %v, want it to say to run sudo apt-get update", err)
	}
	if _, err := os.Stat(updated); err == nil {
		t.Fatal("apt-get update ran without root")
	}
}

func TestKernelPackageFromEnvironment(t *testing.T) {
	t.Setenv(KernelEnv, "linux-image-1.2.3-amd64")
	if pkg, err := KernelPackage(context.Background()); err != nil || pkg != "linux-image-1.2.3-amd64" {
		t.Fatalf("KernelPackage = %q, %v", pkg, err)
	}
}

func TestCachedKernelNeedsEveryFile(t *testing.T) {
	cache := t.TempDir()
	dir := filepath.Join(cache, "linux-image-x")
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, kernelMetaFile), []byte(`{"package":"linux-image-x","release":"x","modules":["irqbypass","kvm","ccp","kvm_amd","e1000","tun","llc","stp","bridge","veth","udp_tunnel","ip6_udp_tunnel","vxlan","sch_ingress","cls_bpf"]}`), 0o644)
	if _, ok := CachedKernel(cache, "linux-image-x"); ok {
		t.Fatal("cached without vmlinux and modules.cpio")
	}
	os.WriteFile(filepath.Join(dir, "vmlinux"), []byte("\x7fELF"), 0o644)
	os.WriteFile(filepath.Join(dir, "modules.cpio"), []byte("070701"), 0o644)
	k, ok := CachedKernel(cache, "linux-image-x")
	if !ok || k.Vmlinux() != filepath.Join(dir, "vmlinux") || k.Release != "x" {
		t.Fatalf("CachedKernel = %+v, %v", k, ok)
	}
}

// TestCachedKernelWithoutTheNetworkDriverIsFetchedAgain: a cache filled
// before the e1000 module was collected does not count.
func TestCachedKernelWithoutTheNetworkDriverIsFetchedAgain(t *testing.T) {
	cache := t.TempDir()
	dir := filepath.Join(cache, "linux-image-x")
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, kernelMetaFile), []byte(`{"package":"linux-image-x","release":"x","modules":["irqbypass","kvm","ccp","kvm_amd"]}`), 0o644)
	os.WriteFile(filepath.Join(dir, "vmlinux"), []byte("\x7fELF"), 0o644)
	os.WriteFile(filepath.Join(dir, "modules.cpio"), []byte("070701"), 0o644)
	if k, ok := CachedKernel(cache, "linux-image-x"); ok {
		t.Fatalf("CachedKernel = %+v, true; want a cache without e1000 to be stale", k)
	}
}
