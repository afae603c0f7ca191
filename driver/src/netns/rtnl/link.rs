//! The issue-27 link settings through rtnetlink: static neighbors (see [`super::super::link`]).

use knic_proto::netconfig::Neighbor;

use super::RtnlSession;
use crate::error::{Error, Result};
use crate::netns::link::{describe_neighbor, neighbor_message};

impl RtnlSession {
    pub(super) async fn set_neighbors_now(
        &mut self,
        name: &str,
        neighbors: &[Neighbor],
    ) -> Result<()> {
        if neighbors.is_empty() {
            return Ok(());
        }
        let index = self.index(name).await?;
        let requests = neighbors
            .iter()
            .map(|neighbor| neighbor_message(index, neighbor))
            .collect();
        self.sent(neighbors.len() as u64);
        let answers = self
            .wire
            .requests(requests)
            .map_err(|e| Error::io(format!("adding static neighbors on {name}"), e))?;
        for (answer, neighbor) in answers.into_iter().zip(neighbors) {
            if let Err(refused) = answer {
                return Err(Error::kernel(
                    self.describe(),
                    format!(
                        "adding static neighbor {} on {name} (neighbors)",
                        describe_neighbor(neighbor)
                    ),
                    refused.to_io().to_string(),
                ));
            }
        }
        Ok(())
    }
}
