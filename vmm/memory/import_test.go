package memory

import (
	"bytes"
	"testing"

	"golang.org/x/sys/unix"
)

func TestFromFdsSharesTheSendersPages(t *testing.T) {
	specs := []RegionSpec{{Name: "ram", Size: 4 * PageSize}, {Name: "high", Base: 1 << 20, Size: 2 * PageSize}}
	src, err := New(specs...)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if err := src.Write(PageSize+3, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	var fds []int
	for _, r := range src.Regions() {
		fd, err := unix.Dup(r.Fd())
		if err != nil {
			t.Fatal(err)
		}
		fds = append(fds, fd)
	}
	dst, err := FromFds(specs, fds)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	got := make([]byte, 5)
	if err := dst.Read(PageSize+3, got); err != nil || !bytes.Equal(got, []byte("hello")) {
		t.Fatalf("read %q, %v", got, err)
	}
	if dst.Regions()[0].Dirty().Count() != 0 {
		t.Error("received memory starts dirty")
	}
	if err := dst.Write(1<<20, []byte("back")); err != nil {
		t.Fatal(err)
	}
	if err := src.Read(1<<20, got[:4]); err != nil || string(got[:4]) != "back" {
		t.Fatalf("sender reads %q, %v", got[:4], err)
	}
}

func TestFromFdsRefusesAShortMemfdAndClosesEveryFd(t *testing.T) {
	src, err := New(RegionSpec{Name: "ram", Size: PageSize})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	fd, err := unix.Dup(src.Regions()[0].Fd())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := FromFds([]RegionSpec{{Name: "ram", Size: 2 * PageSize}}, []int{fd}); err == nil {
		t.Fatal("a memfd shorter than its region was accepted")
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != unix.EBADF {
		t.Fatalf("fd still open after a failed FromFds: %v", err)
	}
}
