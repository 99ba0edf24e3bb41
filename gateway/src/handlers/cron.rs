//! `cron.*`: scheduled agent turns. The ownership rule (`cron_job` in owners.yaml) is checked
//! by the generated dispatch; the store calls below take the caller's tenant as well.

use super::Rpc;
use crate::api::error::GatewayError;
use crate::api::generated::handlers::CronApi;
use crate::api::generated::types::{
    CronAddParams, CronAddResult, CronListParams, CronListResult, CronRemoveParams,
    CronRemoveResult, CronRunParams, CronRunParamsMode, CronRunResult, CronRunResultMode,
    CronRunsParams, CronRunsResult, CronStatusParams, CronStatusResult, CronUpdateParams,
    CronUpdateResult,
};
use crate::api::CallContext;
use crate::clock::now_ms;
use crate::runtime::scheduler::jobs::{fire_to_wire, job_to_wire};

impl CronApi for Rpc {
    async fn add(
        &self,
        ctx: &CallContext,
        p: CronAddParams,
    ) -> Result<CronAddResult, GatewayError> {
        let job = self
            .engine()
            .scheduler
            .cron_add(
                &ctx.client_id,
                &p.name,
                &p.message,
                p.agent_id.as_deref(),
                &p.schedule,
            )
            .await?;
        Ok(CronAddResult {
            id: job.job_id.clone(),
            created: true,
            job: job_to_wire(&job)?,
        })
    }

    async fn list(
        &self,
        ctx: &CallContext,
        _p: CronListParams,
    ) -> Result<CronListResult, GatewayError> {
        let jobs = self.engine().store.cron_list(ctx.tenant()).await?;
        Ok(CronListResult {
            jobs: jobs.iter().map(job_to_wire).collect::<Result<_, _>>()?,
        })
    }

    async fn remove(
        &self,
        ctx: &CallContext,
        p: CronRemoveParams,
    ) -> Result<CronRemoveResult, GatewayError> {
        let engine = self.engine();
        let job = engine
            .scheduler
            .cron_require(ctx.tenant(), &ctx.client_id, &p.name)
            .await?;
        engine.scheduler.cron_remove(&job).await?;
        Ok(CronRemoveResult {
            name: job.name,
            id: job.job_id,
            removed: true,
        })
    }

    async fn run(
        &self,
        ctx: &CallContext,
        p: CronRunParams,
    ) -> Result<CronRunResult, GatewayError> {
        let engine = self.engine();
        match p.mode {
            CronRunParamsMode::Force => {
                let Some(name) = p.name else {
                    return Err(GatewayError::InvalidParams(
                        "name: required with mode force".into(),
                    ));
                };
                let job = engine
                    .scheduler
                    .cron_require(ctx.tenant(), &ctx.client_id, &name)
                    .await?;
                let job_name = job.name.clone();
                engine.scheduler.cron_force(job).await?;
                Ok(CronRunResult {
                    triggered: true,
                    mode: CronRunResultMode::Force,
                    job_name: Some(job_name),
                    job_names: None,
                })
            }
            CronRunParamsMode::Due => {
                let owner = ctx.tenant().only();
                let started = engine
                    .scheduler
                    .fire_due(now_ms(), owner, Some("due"))
                    .await?;
                Ok(CronRunResult {
                    triggered: true,
                    mode: CronRunResultMode::Due,
                    job_name: None,
                    job_names: Some(started),
                })
            }
        }
    }

    async fn runs(
        &self,
        ctx: &CallContext,
        p: CronRunsParams,
    ) -> Result<CronRunsResult, GatewayError> {
        let engine = self.engine();
        // Admin naming a job that exists reads that job's runs (by its id); otherwise the
        // runs recorded under the name (a removed job's too; admin: every owner's).
        let job = match engine
            .store
            .cron_job(ctx.tenant(), &ctx.client_id, &p.job_name)
            .await
        {
            Ok(job) => job,
            Err(GatewayError::Conflict(_)) => None,
            Err(e) => return Err(e),
        };
        let key = match &job {
            Some(job) if ctx.tenant().is_any() => job.job_id.as_str(),
            _ => p.job_name.as_str(),
        };
        let runs = engine
            .store
            .cron_runs(ctx.tenant(), key, p.agent_id.as_deref(), p.limit)
            .await?;
        if runs.is_empty() && job.is_none() {
            return Err(GatewayError::not_found("Cron job", &p.job_name));
        }
        Ok(CronRunsResult {
            runs: runs.iter().map(fire_to_wire).collect(),
        })
    }

    async fn status(
        &self,
        ctx: &CallContext,
        p: CronStatusParams,
    ) -> Result<CronStatusResult, GatewayError> {
        let job = self
            .engine()
            .scheduler
            .cron_require(ctx.tenant(), &ctx.client_id, &p.name)
            .await?;
        job_to_wire(&job)
    }

    async fn update(
        &self,
        ctx: &CallContext,
        p: CronUpdateParams,
    ) -> Result<CronUpdateResult, GatewayError> {
        let engine = self.engine();
        let job = engine
            .scheduler
            .cron_require(ctx.tenant(), &ctx.client_id, &p.name)
            .await?;
        let (updated, job) = engine.scheduler.cron_update(job, &p).await?;
        Ok(CronUpdateResult {
            id: job.job_id.clone(),
            updated,
            job: job_to_wire(&job)?,
        })
    }
}
