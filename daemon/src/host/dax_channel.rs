//! The DAX window as the vhost-user transport's [`BackendChannel`]: the host wires the two
//! layers together here, so neither imports the other for it.

use vhost::vhost_user::Backend;

use crate::dax::DaxWindow;
use crate::transport::vhost_user::BackendChannel;

impl BackendChannel for DaxWindow<Backend> {
    fn set_channel(&self, backend: Backend) {
        log::info!("backend request channel ready: {}", self.describe());
        self.set_sink(backend);
    }

    fn device_started(&self) {
        self.start();
    }

    fn device_paused(&self) {
        // `stop`/`cont` (vhost_dev_stop/start) leave QEMU's SHMEM mappings in place: keep
        // the table as it is and send nothing until the device starts again. No lock taken.
        self.pause();
    }

    fn device_reset(&self) {
        self.reset();
    }

    fn window_size(&self) -> u64 {
        crate::protocol::mapper::Mapper::window_size(self)
    }

    fn round_trips_in_flight(&self) -> usize {
        self.round_trips_in_flight()
    }

    fn memory_regions(&self, n: usize, window_regions: usize) {
        self.note_table_regions(n, window_regions);
    }

    fn window_offset(&self, file: &std::fs::File, foffset: u64, len: u64) -> Option<u64> {
        self.sent_offset(file, foffset, len)
    }

    fn backs_window(&self, file: &std::fs::File) -> bool {
        DaxWindow::backs_window(self, file)
    }

    fn read_window(&self, moffset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        DaxWindow::read_window(self, moffset, buf)
    }

    fn write_window(&self, moffset: u64, data: &[u8]) -> std::io::Result<()> {
        DaxWindow::write_window(self, moffset, data)
    }
}
