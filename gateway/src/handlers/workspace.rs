//! `workspace.*`: an agent's workspace files (`docs/workspaces.md`). Paths are checked and
//! opened by `runtime/workspace`; the git methods and init/status/resetFile are not built
//! yet (-32004 from the catalogue).

use base64::Engine as _;

use crate::api::error::GatewayError;
use crate::api::generated::handlers::WorkspaceApi;
use crate::api::generated::types::{
    WorkspaceDeleteFileParams, WorkspaceDeleteFileResult, WorkspaceFileEncoding,
    WorkspaceListDirParams, WorkspaceListDirResult, WorkspaceListDirResultEntriesItem,
    WorkspaceListDirResultEntriesItemType as EntryType, WorkspaceReadFileParams,
    WorkspaceReadFileResult, WorkspaceWriteFileParams, WorkspaceWriteFileResult,
};
use crate::api::CallContext;
use crate::runtime::workspace::check_path;
use crate::runtime::workspace::confined::Kind;

use super::Rpc;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

impl WorkspaceApi for Rpc {
    async fn list_dir(
        &self,
        _ctx: &CallContext,
        p: WorkspaceListDirParams,
    ) -> Result<WorkspaceListDirResult, GatewayError> {
        let ws = &self.engine().workspaces;
        let dir = match &p.subdir {
            Some(d) => Some(check_path(d, "subdir", ws.private())?),
            None => None,
        };
        let prefix = dir.as_ref().map(|d| format!("{}/", d.shown()));
        let entries = ws.list(&p.agent_id, dir).await?;
        Ok(WorkspaceListDirResult {
            entries: entries
                .into_iter()
                .filter_map(|e| {
                    let type_ = match e.kind {
                        Kind::File => EntryType::File,
                        Kind::Directory => EntryType::Directory,
                        Kind::Symlink => EntryType::Symlink,
                        // Sockets, fifos, devices: not workspace content.
                        Kind::Other => return None,
                    };
                    Some(WorkspaceListDirResultEntriesItem {
                        path: format!("{}{}", prefix.as_deref().unwrap_or(""), e.name),
                        name: e.name,
                        size_bytes: (type_ == EntryType::File)
                            .then(|| i64::try_from(e.size).unwrap_or(i64::MAX)),
                        type_,
                        modified_at: e.modified_ms.max(0),
                    })
                })
                .collect(),
        })
    }

    async fn read_file(
        &self,
        _ctx: &CallContext,
        p: WorkspaceReadFileParams,
    ) -> Result<WorkspaceReadFileResult, GatewayError> {
        let ws = &self.engine().workspaces;
        let path = check_path(&p.file_path, "filePath", ws.private())?;
        let shown = path.shown();
        let read = ws.read(&p.agent_id, path).await?;
        let size = i64::try_from(read.bytes.len()).unwrap_or(i64::MAX);
        let (content, encoding) = match String::from_utf8(read.bytes) {
            Ok(text) => (text, WorkspaceFileEncoding::Utf8),
            Err(e) => (B64.encode(e.into_bytes()), WorkspaceFileEncoding::Base64),
        };
        Ok(WorkspaceReadFileResult {
            file_path: shown,
            content,
            encoding,
            size_bytes: size,
            modified_at: read.modified_ms.max(0),
        })
    }

    async fn write_file(
        &self,
        _ctx: &CallContext,
        p: WorkspaceWriteFileParams,
    ) -> Result<WorkspaceWriteFileResult, GatewayError> {
        let ws = &self.engine().workspaces;
        let path = check_path(&p.file_path, "filePath", ws.private())?;
        let bytes = match p.encoding {
            WorkspaceFileEncoding::Utf8 => p.content.into_bytes(),
            WorkspaceFileEncoding::Base64 => B64.decode(p.content.as_bytes()).map_err(|e| {
                GatewayError::InvalidParams(format!("'content' is not valid base64: {e}"))
            })?,
        };
        let size = i64::try_from(bytes.len()).unwrap_or(i64::MAX);
        let shown = path.shown();
        ws.write(&p.agent_id, path, bytes).await?;
        Ok(WorkspaceWriteFileResult {
            written: true,
            file_path: shown,
            size_bytes: size,
        })
    }

    async fn delete_file(
        &self,
        _ctx: &CallContext,
        p: WorkspaceDeleteFileParams,
    ) -> Result<WorkspaceDeleteFileResult, GatewayError> {
        let ws = &self.engine().workspaces;
        let path = check_path(&p.file_path, "filePath", ws.private())?;
        let shown = path.shown();
        ws.delete(&p.agent_id, path).await?;
        Ok(WorkspaceDeleteFileResult {
            deleted: true,
            file_path: shown,
        })
    }
}
